"""Registering a PEFT method from outside PEFT: ``register_peft_method`` accepts only names of
``peft.utils.PeftType``, a closed ``str`` enum, so the member is added first (the enum's own
maps, as its metaclass builds them), then the public registration runs once per name."""

from __future__ import annotations

from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING, PEFT_TYPE_TO_TUNER_MAPPING
from peft.utils import PeftType, register_peft_method

__all__ = ["peft_type", "register"]


def peft_type(name: str) -> PeftType:
    """The ``PeftType`` member ``name`` (upper case), added to the enum when it is new."""
    if name in PeftType.__members__:
        return PeftType[name]
    member = str.__new__(PeftType, name)
    member._name_ = name
    member._value_ = name
    type.__setattr__(PeftType, name, member)
    PeftType._member_map_[name] = member
    PeftType._value2member_map_[name] = member
    PeftType._member_names_.append(name)
    return member


def register(name: str, config_cls: type, model_cls: type) -> None:
    """``register_peft_method`` for ``name`` (lower case), once per process."""
    member = peft_type(name.upper())
    old = PEFT_TYPE_TO_TUNER_MAPPING.get(member)
    if old is model_cls:
        return
    if old is not None and (old.__module__, old.__qualname__) == (
        model_cls.__module__,
        model_cls.__qualname__,
    ):  # this module imported afresh (importlib.reload): PEFT gets the new classes
        PEFT_TYPE_TO_TUNER_MAPPING[member] = model_cls
        PEFT_TYPE_TO_CONFIG_MAPPING[member] = config_cls
        return
    register_peft_method(
        name=name, config_cls=config_cls, model_cls=model_cls, prefix=model_cls.prefix
    )
