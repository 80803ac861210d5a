"""nebulgym's ``patches.pytorch`` package: `meprop_linear`."""
