// The HPC view: renders api/jobs into one section per cluster profile (what the workers and
// triggerers recorded: the server never asks the cluster during a request).
// Plain DOM code, no library: the page is served by the plugin and works without internet.
"use strict";

const params = new URLSearchParams(window.location.search);
const focus = { dag_id: params.get("dag_id"), run_id: params.get("run_id"), task_id: params.get("task_id") };

// Same rule as charts.figure: 4 decimals under 10 (or when precise), else 1, with thousands separators.
function fmt(value, precise) {
  if (value === null || value === undefined) return "n/a";
  const digits = precise || Math.abs(value) < 10 ? 4 : 1;
  return value.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function apiUrl(path) {
  const query = new URLSearchParams();
  for (const key of ["dag_id", "run_id"]) if (focus[key]) query.set(key, focus[key]);
  const qs = query.toString();
  return path + (qs ? "?" + qs : "");
}

function uiLink(path) {
  // Task pages of the Airflow UI live next to this plugin's prefix.
  return new URL(".." + path, window.location.href).toString();
}

function jobsTable(jobs) {
  const head = el("tr", {}, ...["DAG run", "Task / stage", "Slurm job(s)", "State", "Restarts", "Elapsed",
    "GPU-hours", "Task", "Log"].map((h, i) => el("th", { class: [4, 5, 6].includes(i) ? "num" : null }, h)));
  const table = el("table", { class: "jobs" }, el("thead", {}, head));
  const body = el("tbody");
  for (const job of jobs) {
    const ids = el("div", {});
    const subs = job.submissions.length ? job.submissions : job.job_ids.map((id, i) => ({ job_id: id, number: i + 1, cause: "" }));
    subs.forEach((s, i) => {
      if (i) ids.append(", ");
      ids.append(el("code", { class: "job-id" }, s.job_id));
      if (s.cause && s.cause !== "initial") ids.append(el("span", { class: "muted" }, " (" + s.cause.toLowerCase() + ")"));
    });
    const category = job.category || (job.state ? "unknown" : job.unreachable_since ? "unreachable" : "waiting");
    const shown = job.state || (job.last_seen ? job.last_seen + " (watch)" : "not recorded");
    const stateCell = el("td", {}, el("span", { class: "state " + category }, shown),
      el("div", { class: "desc" }, job.state_description));
    if (job.pending) stateCell.append(el("div", { class: "pending", title: job.pending.explanation },
      "Pending: " + (job.pending.words || job.pending.code + ": " + job.pending.explanation)));
    if (job.handles) stateCell.append(el("details", { class: "handles" }, el("summary", {}, "Reach it by hand"),
      ...[["A shell beside it", job.handles.shell], ["Its output", job.handles.follow], ["Cancel it", job.handles.cancel]]
        .map(([what, command]) => el("div", {}, el("span", { class: "muted" }, what + ": "), el("code", { class: "command" }, command)))));
    const row = el("tr", { id: "job-" + job.job_id, "data-job-id": job.job_id, "data-task-id": job.task_id, "data-run-id": job.run_id,
      "data-gpu-hours": String(job.gpu_hours), "data-state": job.state || "" },
      el("td", {}, el("div", {}, job.run_id), job.run_name ? el("div", { class: "muted" }, "run " + job.run_name) : null),
      el("td", {}, job.task_id, job.stage !== job.task_id ? el("div", { class: "muted" }, job.stage) : null),
      el("td", {}, ids, job.resubmissions ? el("div", { class: "muted" }, job.resubmissions + " resubmission(s)") : null,
        job.left_out_words ? el("div", { class: "left-out", title: "sbatch --exclude: this project's jobs failed there for the node's fault" },
          "Nodes left out: " + job.left_out_words) : null),
      stateCell,
      el("td", { class: "num" }, job.restarts),
      el("td", { class: "num" }, job.elapsed),
      el("td", { class: "num gpu-hours" }, fmt(job.gpu_hours)),
      el("td", {}, job.task_state || ""),
      el("td", {}, el("a", { href: uiLink(job.log_url), target: "_top" }, "task log")));
    if (focus.task_id && job.task_id === focus.task_id && (!focus.run_id || job.run_id === focus.run_id)) row.classList.add("highlight");
    body.append(row);
  }
  table.append(body);
  return table;
}

// A validation gain with its unit: dB for PSNR, the metric's name otherwise.
function gain(value, metric, suffix) {
  if (value === null || value === undefined) return "n/a";
  const unit = metric === "psnr" ? "dB" : (metric || "");
  return (value >= 0 ? "+" : "") + value.toFixed(3) + " " + unit + (suffix || "");
}

function runStageTable(budget) {
  const table = el("table", { class: "run-stage" }, el("thead", {}, el("tr", {},
    el("th", {}, "DAG run"), el("th", {}, "Stage"), el("th", { class: "num" }, budget.unit),
    el("th", { class: "num" }, "Validation gain over its start"), el("th", { class: "num" }, "Gain per " + budget.unit.replace(/s$/, "")),
    el("th", {}, "Stopped"))));
  const body = el("tbody");
  for (const row of budget.by_run_stage) {
    body.append(el("tr", { "data-run-id": row.run_id, "data-stage": row.stage },
      el("td", {}, row.run_id), el("td", {}, row.stage), el("td", { class: "num" }, fmt(row.gpu_hours)),
      el("td", { class: "num validation-gain" }, gain(row.validation_gain, row.gain_metric)),
      el("td", { class: "num gain-per-hour" }, gain(row.gain_per_gpu_hour, row.gain_metric)),
      el("td", { class: "stop-reason" }, row.stop_reason === "patience" ? "early: no validation gain"
        : row.stop_reason === "epochs" ? "at its epochs" : "")));
  }
  table.append(body);
  return table;
}

function svg(text) {
  const holder = el("div", { class: "chart" });
  holder.innerHTML = text;  // produced by the plugin from numbers, every label escaped server-side
  return holder;
}

function curvesBlock(curves) {
  const block = el("div", { class: "curves" });
  for (const c of curves) {
    const state = c.state || c.task_state || "";
    const head = el("div", { class: "curve-head" }, el("b", {}, "run " + (c.run_name || "?") + " - stage " + c.stage),
      " ", el("code", { class: "job-id" }, c.job_id), state ? el("span", { class: "muted" }, " " + state.toLowerCase()) : null,
      c.live ? el("span", { class: "live" }, " live") : null,
      c.recorded_at ? el("span", { class: "muted" }, " - recorded " + new Date(c.recorded_at).toLocaleString()) : null,
      c.live_at ? el("span", { class: "muted" }, " - as of " + Math.round(c.as_of_s) + " s ago") : null);
    const box = el("div", { class: "curve", id: "curve-" + (c.run_name || c.run_id) + "-stage" + c.stage,
      "data-stage": String(c.stage), "data-run-name": c.run_name, "data-points": String(c.points.loss.length + c.points.val_psnr.length) },
      head, el("div", { class: "curve-charts" }, svg(c.charts.loss), svg(c.charts.val_psnr)));
    if (c.problem) box.append(el("p", { class: "muted curve-problem" }, c.problem));
    if (c.path) box.append(el("div", { class: "muted" }, el("code", {}, c.path)));
    block.append(box);
  }
  return block;
}

function profileSection(profile) {
  const b = profile.budget;
  const section = el("section", { class: "profile", id: "profile-" + (profile.profile || "none"), "data-profile": profile.profile });
  section.append(el("h2", {}, "Profile " + profile.title, profile.description ? el("span", { class: "muted" }, " - " + profile.description) : null));
  if (profile.problem) section.append(el("p", { class: "problems" }, profile.problem));
  const line = el("p", { class: "budget-line" });
  const reported = b.source === "slurm" || b.source === "command";  // the site's figures: every job of the project
  if (b.allocation !== null && reported) {
    line.append("Allocation ", el("b", { class: "allocation" }, fmt(b.allocation)), " " + b.unit + " - used by the account ",
      el("b", { class: "account-used" }, fmt(b.account_used)), ", left ", el("b", { class: "left" }, fmt(b.left, true)),
      " - used by the jobs recorded here ", el("b", { class: "used" }, fmt(b.used)));
  } else if (b.allocation !== null) {
    line.append("Allocation ", el("b", { class: "allocation" }, fmt(b.allocation)), " " + b.unit + " - used ",
      el("b", { class: "used" }, fmt(b.used)), ", left ", el("b", { class: "left" }, fmt(b.left, b.used < 10)));
  } else {
    line.append("Used ", el("b", { class: "used" }, fmt(b.used)), " " + b.unit + " (no allocation tracked)");
  }
  line.append(" - " + b.jobs + " completed job record(s)");
  section.append(line);
  // Where each figure comes from: Slurm's limit on the account, the site's command, or the profile's billing.allocation.
  const source = el("p", { class: "budget-source muted", "data-source": b.source },
    "Allocation from: " + (b.allocation_from || "none"));
  if (reported) {
    source.append(el("br"), "Used by the account from: " + b.used_from + (b.as_of ? " (read when a job ended, " + new Date(b.as_of).toLocaleString() + ")" : ""));
  } else {
    source.append(el("br"), "Used from: the GPU-hours the jobs recorded here cost (sacct)");
  }
  section.append(source);
  if (b.pace) section.append(el("p", { class: "pace " + (b.pace.verdict || "").replace(" ", "-"), "data-verdict": b.pace.verdict || "" },
    "Pace: " + b.pace.words));
  section.append(el("div", { class: "charts" }, svg(profile.charts.burndown), svg(profile.charts.by_stage), svg(profile.charts.by_run)));
  if (profile.curves && profile.curves.length) {
    section.append(el("h3", {}, "Training curves"), curvesBlock(profile.curves));
  }
  section.append(el("h3", {}, "GPU-hours per run and stage"), runStageTable(b));
  section.append(el("h3", {}, "Jobs"), jobsTable(profile.jobs));
  return section;
}

// While a stage trains, the view is loaded again every curve_interval_s (from the database only).
let nextLoad = null;

function render(view) {
  const main = document.getElementById("profiles");
  main.replaceChildren(...view.profiles.map(profileSection));
  if (!view.profiles.length) main.append(el("p", { class: "muted" }, "No Slurm job recorded yet by the operators (in the DAGs you may read)."));
  const problems = document.getElementById("problems");
  problems.replaceChildren(...(view.problems || []).map((p) => el("li", {}, p)));
  document.getElementById("status").textContent =
    "loaded " + new Date(view.as_of || Date.now()).toLocaleTimeString() + " - " + view.jobs + " job record(s)";
  document.body.setAttribute("data-loaded", "true");
  clearTimeout(nextLoad);
  const live = view.profiles.some((p) => (p.curves || []).some((c) => c.live));
  if (live) nextLoad = setTimeout(() => load("api/jobs"), 1000 * (view.curve_interval_s || 30));
  const target = window.location.hash && document.querySelector(window.location.hash);
  if (target) { target.classList.add("highlight"); target.scrollIntoView(); }
}

async function load(path, method) {
  const status = document.getElementById("status");
  status.textContent = "loading...";
  try {
    const response = await fetch(apiUrl(path), { method: method || "GET", credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(response.status + " " + (await response.text()));
    render(await response.json());
  } catch (err) {
    status.textContent = "could not load: " + err.message;
    document.body.setAttribute("data-loaded", "error");
  }
}

const scope = [focus.dag_id, focus.run_id, focus.task_id].filter(Boolean).join(" / ");
document.getElementById("scope").textContent = scope ? "showing " + scope : "";
document.getElementById("refresh").addEventListener("click", () => load("api/jobs"));
load("api/jobs");
