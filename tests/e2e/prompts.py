"""Prompts for the end-to-end tests: Python source, the quick pair's training domain."""

PROMPTS = [
    "def __init__(self, name, value):\n",
    "import os\nimport sys\n\n",
    "class Config(object):\n    \"\"\"",
    "for i in range(len(items)):\n",
    "    return self._data[key]\n\n    def ",
    "if __name__ == '__main__':\n",
    "try:\n    import threading\nexcept ImportError:\n",
    "def test_basic(self):\n        self.assert",
]


def many(n: int) -> list[str]:
    """``n`` distinct prompts."""
    return [f"{PROMPTS[i % len(PROMPTS)]}{'    ' * (i // len(PROMPTS))}" for i in range(n)]
