"""The widgets tqdm.notebook builds its bar of (FloatProgress, HTML, HBox), which hold their attributes and draw
nothing: with them a `tqdm.notebook` loop runs as a script (the real module raises without ipywidgets)."""

from types import SimpleNamespace


class Widget:
    def __init__(self, **kwargs):
        self.layout, self.style = SimpleNamespace(), SimpleNamespace(bar_color=None)
        self.value, self.bar_style = None, ""
        self.__dict__.update(kwargs)

    def close(self):
        return None


class FloatProgress(Widget):
    pass


class HTML(Widget):
    pass


class HBox(Widget):
    pass
