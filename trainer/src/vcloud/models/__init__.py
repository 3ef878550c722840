"""vcloud models: stage-0 autoencoder, stage-1 draft model (CFDT), stage-2 latent diffusion
refiner and stage-3 self-training, with the memory switches that let the full draft model fit a
64 GB MI250X GCD."""
