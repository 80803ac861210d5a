"""nebulgym's ``decorators`` package: `torch_decorators` and `helpers`."""
