"""Draw a step's action on its screenshot.

Coordinates come from the action itself (``mouse_click(120, 48)``,
``mouse_drag_and_drop(10, 10, 200, 40)``). Element actions (``click('42')``,
``fill('17', 'x')``) are drawn where the step's ``extra`` JSON stores the element's
box, in any of these forms (BrowserGym's ``extra_element_properties`` included):

    {"action_bbox": [x, y, width, height]}
    {"element_bbox": {"x": .., "y": .., "width": .., "height": ..}}
    {"element_bboxes": {"42": [x, y, width, height]}}
    {"extra_element_properties": {"42": {"bbox": [x, y, width, height], ...}}}

Boxes are in screenshot pixels (CSS pixels at device scale 1, as BrowserGym's
screenshots are). A step with neither is shown without a mark.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from typing import Any

from PIL import Image, ImageDraw

_NUMBER = r"(-?\d+(?:\.\d+)?)"
_MOUSE_POINT = re.compile(r"^\s*(mouse_\w+)\s*\(\s*" + _NUMBER + r"\s*,\s*" + _NUMBER)
_DRAG = re.compile(
    r"^\s*mouse_drag_and_drop\s*\(\s*" + r"\s*,\s*".join([_NUMBER] * 4)
)
_ELEMENT = re.compile(r"^\s*(\w+)\s*\(\s*(['\"])(.*?)\2")

MARK_COLOUR = (230, 30, 60, 255)


@dataclasses.dataclass(frozen=True)
class ActionMark:
    """Where an action acted: points (clicks, drag ends) and/or an element box."""

    kind: str  # "point" | "drag" | "box"
    points: tuple[tuple[float, float], ...] = ()
    box: tuple[float, float, float, float] | None = None  # x, y, width, height
    element: str | None = None

    def describe(self) -> str:
        if self.kind == "box" and self.box is not None:
            x, y, w, h = self.box
            return f"element {self.element} at ({x:.0f}, {y:.0f}), {w:.0f}×{h:.0f}"
        return " → ".join(f"({x:.0f}, {y:.0f})" for x, y in self.points)


def _box(value: Any) -> tuple[float, float, float, float] | None:
    try:
        if isinstance(value, dict):
            if {"x", "y", "width", "height"} <= value.keys():
                return (float(value["x"]), float(value["y"]), float(value["width"]), float(value["height"]))
            if {"left", "top", "right", "bottom"} <= value.keys():
                left, top = float(value["left"]), float(value["top"])
                return (left, top, float(value["right"]) - left, float(value["bottom"]) - top)
            if "bbox" in value:
                return _box(value["bbox"])
            return None
        if isinstance(value, (list, tuple)) and len(value) == 4 and all(v is not None for v in value):
            x, y, w, h = (float(v) for v in value)
            return (x, y, w, h)
    except (TypeError, ValueError):
        return None
    return None


def element_box(extra: str | dict | None, element: str | None) -> tuple[float, float, float, float] | None:
    """The stored box of the element an action acted on, or None."""
    if not extra:
        return None
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            return None
    if not isinstance(extra, dict):
        return None
    for key in ("action_bbox", "element_bbox"):
        box = _box(extra.get(key))
        if box is not None:
            return box
    if element is not None:
        for key in ("element_bboxes", "bboxes", "extra_element_properties"):
            table = extra.get(key)
            if isinstance(table, dict) and element in table:
                box = _box(table[element])
                if box is not None:
                    return box
    return None


def action_mark(action: str | None, extra: str | dict | None = None) -> ActionMark | None:
    """Where ``action`` acted, from its coordinates or its element's stored box."""
    if not action:
        return None
    m = _DRAG.match(action)
    if m:
        x0, y0, x1, y1 = (float(v) for v in m.groups())
        return ActionMark("drag", ((x0, y0), (x1, y1)))
    m = _MOUSE_POINT.match(action)
    if m:
        return ActionMark("point", ((float(m.group(2)), float(m.group(3))),))
    m = _ELEMENT.match(action)
    element = m.group(3) if m else None
    box = element_box(extra, element)
    if box is not None:
        return ActionMark("box", box=box, element=element)
    return None


def draw_action(image: bytes, mark: ActionMark | None) -> Image.Image:
    """The screenshot with the mark drawn on it (unchanged when there is no mark)."""
    img = Image.open(io.BytesIO(image)).convert("RGBA")
    if mark is None:
        return img
    overlay = Image.new("RGBA", img.size, (0, 0, 0, 0))
    pen = ImageDraw.Draw(overlay)
    width = max(2, round(min(img.size) / 200))
    if mark.kind == "box" and mark.box is not None:
        x, y, w, h = mark.box
        pen.rectangle([x, y, x + w, y + h], outline=MARK_COLOUR, width=width)
        pen.rectangle([x, y, x + w, y + h], fill=MARK_COLOUR[:3] + (40,))
    else:
        radius = max(8, round(min(img.size) / 40))
        for x, y in mark.points:
            pen.ellipse([x - radius, y - radius, x + radius, y + radius], outline=MARK_COLOUR, width=width)
            pen.line([x - radius * 1.6, y, x + radius * 1.6, y], fill=MARK_COLOUR, width=max(1, width // 2))
            pen.line([x, y - radius * 1.6, x, y + radius * 1.6], fill=MARK_COLOUR, width=max(1, width // 2))
        if mark.kind == "drag" and len(mark.points) == 2:
            pen.line([*mark.points[0], *mark.points[1]], fill=MARK_COLOUR, width=width)
    return Image.alpha_composite(img, overlay)
