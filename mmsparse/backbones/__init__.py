"""Frozen vision-language backbones (`load_backbone(name, model, device)`)."""

from .base import Backbone, backbone_from_attrs, backbone_names, load_backbone, register_backbone

__all__ = ["Backbone", "backbone_from_attrs", "backbone_names", "load_backbone", "register_backbone"]
