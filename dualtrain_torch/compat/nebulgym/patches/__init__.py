"""nebulgym's ``patches`` package: `pytorch.meprop_linear`."""
