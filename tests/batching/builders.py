"""Small random architectures for the batching laws: torch modules and Crafts, one recipe."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from dualtrain import Craft, dock


@dataclasses.dataclass(frozen=True)
class Recipe:
    """An MLP (features in) or a CNN (one channel, side x side), with or without BatchNorm."""

    kind: str  # "mlp" | "cnn"
    features: int  # MLP input features, or the CNN image side
    hidden: int
    classes: int
    norm: bool
    dropout: bool

    def input_shape(self) -> tuple[int, ...]:
        return (self.features,) if self.kind == "mlp" else (1, self.features, self.features)


recipes = st.builds(
    Recipe,
    kind=st.sampled_from(["mlp", "cnn"]),
    features=st.integers(2, 4),
    hidden=st.integers(2, 4),
    classes=st.integers(2, 4),
    norm=st.booleans(),
    dropout=st.booleans(),
)


def torch_module(recipe: Recipe):
    """The recipe as a plain torch ``nn.Sequential`` (float64)."""
    from torch import nn

    r = recipe
    if r.kind == "mlp":
        layers = [nn.Linear(r.features, r.hidden)]
        layers += [nn.BatchNorm1d(r.hidden)] if r.norm else []
        layers += [nn.Tanh(), nn.Dropout(0.3)] if r.dropout else [nn.Tanh()]
        layers += [nn.Linear(r.hidden, r.classes)]
    else:
        layers = [nn.Conv2d(1, r.hidden, 3, padding=1)]
        layers += [nn.BatchNorm2d(r.hidden)] if r.norm else []
        layers += [nn.ReLU(), nn.Dropout(0.3)] if r.dropout else [nn.ReLU()]
        layers += [nn.Flatten(), nn.Linear(r.hidden * r.features**2, r.classes)]
    return nn.Sequential(*layers).double()


class RecipeNet(Craft):
    """The recipe as a Craft (realizes under torch and JAX with the same weights)."""

    def __init__(self, recipe: Recipe):
        super().__init__("RECIPE")
        r = self.recipe = recipe
        if r.kind == "mlp":
            self.first = dock.Dense(r.features, r.hidden)
            flat = r.hidden
        else:
            self.first = dock.Conv(1, r.hidden, kernel=3, padding=1)
            flat = r.hidden * r.features**2
        if r.norm:
            self.norm = dock.BatchNorm(r.hidden)
        self.flat = dock.Flatten()
        self.last = dock.Dense(flat, r.classes)

    def run(self, x):
        h = self.first(x)
        if self.recipe.norm:
            h = self.norm(h)
        h = dock.tanh(h)
        return self.last(self.flat(h))
