"""IPython.display's helpers as a script sees them: nothing to display into, so they do nothing."""


def display(*objects, **kwargs):
    return None


def clear_output(wait=False):
    return None


def set_matplotlib_formats(*formats, **kwargs):  # the inline backend's figure formats; scripts run under Agg
    return None


class _Shown:
    def __init__(self, data=None, *args, **kwargs):
        self.data = data

    def _repr_html_(self):
        return self.data


HTML = Markdown = Image = SVG = Latex = Math = Javascript = _Shown
