"""Typed launch knobs: one frozen dataclass per kernel family (its defaults are the measured ones).

Launchers take `config=` as an instance or as a dict of overrides (tests, sweeps, tools); an unknown key is a
TypeError naming the family's knobs, never a silently ignored setting. Instances read like mappings too
(`cfg["BLOCK_N"]`, `cfg.get(...)`, `dict(cfg)`), so a dict of knobs and a config compare and combine alike.
"""
from dataclasses import dataclass, fields, replace
from typing import Mapping, Optional, Union


@dataclass(frozen=True)
class KernelConfig:
    @classmethod
    def knobs(cls) -> tuple:
        return tuple(f.name for f in fields(cls))

    def with_(self, overrides: Union[None, "KernelConfig", Mapping] = None) -> "KernelConfig":
        """This config with `overrides` (a dict of knobs, or a whole config of this family) applied."""
        if overrides is None or (isinstance(overrides, Mapping) and not overrides):
            return self
        if isinstance(overrides, type(self)):
            return overrides
        if not isinstance(overrides, Mapping):
            raise TypeError(f"config must be a {type(self).__name__} or a dict of its knobs, got "
                            f"{type(overrides).__name__}")
        unknown = sorted(set(overrides) - set(self.knobs()))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no knob {', '.join(unknown)} (knobs: "
                            f"{', '.join(self.knobs())})")
        return replace(self, **dict(overrides))

    @classmethod
    def of(cls, config: Union[None, "KernelConfig", Mapping], default: Optional["KernelConfig"] = None):
        """config as this family's type: a whole config, or a dict of knobs over `default` (or the class defaults)."""
        if isinstance(config, cls):
            return config
        base = default if default is not None else cls()
        return base.with_(config)

    # mapping reads (dict(cfg), cfg["k"], cfg.get("k")): the knobs and their values
    def keys(self):
        return self.knobs()

    def __iter__(self):
        return iter(self.knobs())

    def __contains__(self, key) -> bool:
        return key in self.knobs()

    def __getitem__(self, key):
        if key not in self.knobs():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key, default=None):
        return getattr(self, key) if key in self.knobs() else default

    def items(self):
        return [(k, getattr(self, k)) for k in self.knobs()]
