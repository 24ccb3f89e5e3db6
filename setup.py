"""Package discovery (everything else is in pyproject.toml): the import name `rewrite` spans four folders
(pyproject's ``package-dir``), and every folder below them with an ``__init__.py`` is a package, so a new model
or kernel family installs without being listed anywhere."""

from setuptools import find_packages, setup

#: import name -> folder, as pyproject.toml's [tool.setuptools] package-dir maps them
FOLDERS = {"rewrite": "rewrite", "rewrite.passes": "passes", "rewrite.patterns": "patterns", "rewrite.tools": "tools"}


def packages() -> list[str]:
    found = []
    for name, folder in FOLDERS.items():
        found += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
    return sorted(set(found))


setup(packages=packages())
