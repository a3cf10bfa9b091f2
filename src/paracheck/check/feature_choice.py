"""What a check's ``contract`` and ``features`` leave drawn: ``features`` parsed once
(``parse_features``, by the plan: Note [One plan per check] in ``paracheck.check.plan``), and the
features never drawn under both (``features_off``)."""

from __future__ import annotations

from paracheck.check.features import CONTRACTS, FEATURES, closure, feature
from paracheck.errors import FeatureError

__all__ = ["FeatureChanges", "features_off", "parse_features"]


class FeatureChanges(tuple):
    """What ``features`` asks, parsed (``parse_features``): ((name, drawn), ...) in order, and as
    ``str()`` the text it was given, for the messages that name it. Parsed once, by the plan
    (Note [One plan per check] in ``paracheck.check.plan``), and passed on as it is."""

    text: str

    def __new__(cls, pairs, text: str):
        changes = super().__new__(cls, pairs)
        changes.text = text
        return changes

    def __str__(self) -> str:
        return self.text

    @property
    def removed(self) -> frozenset[str]:
        """The features the last change of each name leaves never drawn."""
        return frozenset(name for name, drawn in dict(self).items() if not drawn)


def parse_features(spec) -> FeatureChanges:
    """``"-name,+name"`` (or an iterable of such items) -> ((name, drawn), ...), in order:
    ``-name`` never draws the feature, ``+name`` draws it again. ``FeatureError`` naming the item.
    ``FeatureChanges`` already parsed are returned as they are."""
    if isinstance(spec, FeatureChanges):
        return spec
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for raw in items:
        item = str(raw).strip()
        if not item:
            continue
        sign, name = item[0], item[1:].strip()
        if sign not in "+-" or not name:
            raise FeatureError(
                "features",
                spec,
                f"{item!r} must be -name (never draw it) or +name (draw it again), "
                "e.g. -unused-some-ranks",
            )
        if name not in {f.name for f in FEATURES}:
            raise FeatureError(
                "features",
                spec,
                f"{name!r} is not a feature; the features are "
                + ", ".join(f.name for f in FEATURES),
            )
        out.append((name, sign == "+"))
    return FeatureChanges(out, spec if isinstance(spec, str) else ",".join(map(str, items)))


def features_off(
    contract: str = "full", features=None, *, dtype: str = "float64"
) -> tuple[str, ...]:
    """The features never drawn under ``contract`` (``CONTRACTS``) changed by ``features``
    (``parse_features``), in table order, with every feature that implies or requires one of them.
    ``FeatureError`` for an unknown contract or feature, for ``+name`` whose feature needs one that
    is off, and for low-precision off in a check of a low-precision ``dtype``."""
    if contract not in CONTRACTS:
        raise FeatureError("contract", contract, f"must be one of {', '.join(CONTRACTS)}")
    off = set(CONTRACTS[contract].off)
    wanted = set()
    for name, drawn in parse_features(features or ()):
        (off.discard if drawn else off.add)(name)
        (wanted.add if drawn else wanted.discard)(name)
    off = closure(off)
    clash = sorted(wanted & off)
    if clash:
        f = feature(clash[0])
        needed = [n for n in f.implies + f.requires if n in off]
        raise FeatureError(
            "features",
            features,
            f"+{clash[0]} needs {', '.join(needed)}, which {'is' if len(needed) == 1 else 'are'} "
            f"not drawn (contract {contract})",
        )
    if "low-precision" in off and dtype != "float64":
        raise FeatureError(
            "features", features, f"low-precision is turned off, but the check runs in {dtype}"
        )
    return tuple(f.name for f in FEATURES if f.name in off)
