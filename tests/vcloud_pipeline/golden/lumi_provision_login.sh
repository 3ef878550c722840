umask 002
if [ -f /projappl/project_465002500/pylibs/9caf97b2e4388733/.vcloud_requirements ]; then echo "VCLOUD-PROVISION present /projappl/project_465002500/pylibs/9caf97b2e4388733"; cat /projappl/project_465002500/pylibs/9caf97b2e4388733/.vcloud_requirements; exit 0; fi
mkdir -p /projappl/project_465002500/pylibs || exit 70
lock=/projappl/project_465002500/pylibs/.vcloud-provision.lock; here=$(hostname); waited=0
until mkdir -m 775 "$lock" 2>/dev/null; do holder=$(cat "$lock"/owner 2>/dev/null); stale=; if [ -n "$holder" ]; then if [ "${holder%% *}" = "$here" ]; then [ -d "/proc/${holder#* }" ] || stale=1; elif [ -n "$(find "$lock"/owner -mmin +1 2>/dev/null)" ]; then stale=1; fi; elif [ -n "$(find "$lock" -maxdepth 0 -mmin +1 2>/dev/null)" ]; then stale=1; fi; if [ -n "$stale" ]; then if mv -T "$lock" "$lock.stale.$$" 2>/dev/null; then if [ "$(cat "$lock.stale.$$/owner" 2>/dev/null)" = "$holder" ]; then rm -rf "$lock.stale.$$"; else mv -T "$lock.stale.$$" "$lock" 2>/dev/null; fi; fi; continue; fi; waited=$((waited + 1)); if [ "$waited" -gt 1200 ]; then echo "provision: error: another installer holds $lock (${holder:-owner unknown}); try again" >&2; exit 75; fi; sleep 0.1; done
echo "$here $$" > "$lock"/owner
( while sleep 5 && [ -d "/proc/$$" ]; do touch -c "$lock"/owner 2>/dev/null || exit 0; done ) </dev/null >/dev/null 2>&1 & keeper=$!
trap 'kill $keeper 2>/dev/null; rm -f "$lock"/owner; rmdir "$lock" 2>/dev/null' EXIT
if [ -f /projappl/project_465002500/pylibs/9caf97b2e4388733/.vcloud_requirements ]; then echo "VCLOUD-PROVISION present /projappl/project_465002500/pylibs/9caf97b2e4388733"; cat /projappl/project_465002500/pylibs/9caf97b2e4388733/.vcloud_requirements; exit 0; fi
binds=()
rm -rf /projappl/project_465002500/pylibs/.9caf97b2e4388733.building && mkdir -p /projappl/project_465002500/pylibs/.9caf97b2e4388733.building || exit 70
report=$(env -u PYTHONPATH PYTHONNOUSERSITE=1 singularity exec -B /projappl/project_465002500/pylibs "${binds[@]}" /appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif python3 -c 'import sys
from importlib import metadata
for pin in sys.argv[1:]:
    name, _, version = pin.partition("==")
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        print("missing", pin)
    else:
        print("have", pin, found)
' PyYAML==6.0.3 tifffile==2026.3.3 torch==2.13.0 2>&1); status=$?
printf '%s\n' "$report"
if [ "$status" -ne 0 ]; then echo "VCLOUD-PROVISION check-failed exit $status"; rm -rf /projappl/project_465002500/pylibs/.9caf97b2e4388733.building; exit 71; fi
mapfile -t missing < <(printf '%s\n' "$report" | sed -n 's/^missing //p')
if [ "${#missing[@]}" -gt 0 ]; then
  echo "VCLOUD-PROVISION installing ${missing[*]}"
  env -u PYTHONPATH PYTHONNOUSERSITE=1 singularity exec -B /projappl/project_465002500/pylibs "${binds[@]}" /appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif python3 -m pip install --no-deps --only-binary=:all: --no-cache-dir --disable-pip-version-check --no-input --no-warn-script-location --progress-bar off --retries 1 --timeout 20 --target /projappl/project_465002500/pylibs/.9caf97b2e4388733.building "${missing[@]}" 2>&1
  status=$?; if [ "$status" -ne 0 ]; then echo "VCLOUD-PROVISION install-failed exit $status"; rm -rf /projappl/project_465002500/pylibs/.9caf97b2e4388733.building; exit 72; fi
fi
{ echo "requirements 5e50102458557d54"; echo "set 9caf97b2e4388733"; printf '%s\n' 'image /appl/local/csc/soft/ai/images/pytorch_2.5.1_lumi_rocm6.2.4_flash-attn-3.0.0.post1.sif' 'image-identity size 21474836480 mtime 1767225600' "$report"; echo "installed $(hostname) $(date -u +%Y-%m-%dT%H:%M:%SZ)"; } > /projappl/project_465002500/pylibs/.9caf97b2e4388733.building/.vcloud_requirements || exit 70
mv -T /projappl/project_465002500/pylibs/.9caf97b2e4388733.building /projappl/project_465002500/pylibs/9caf97b2e4388733 || exit 70
chmod -R a-w -- /projappl/project_465002500/pylibs/9caf97b2e4388733 || exit 70
echo "VCLOUD-PROVISION installed /projappl/project_465002500/pylibs/9caf97b2e4388733"
