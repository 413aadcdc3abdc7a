"""Package list for setuptools; everything else about the build is in pyproject.toml.

The icons live in the top-level ``resources/`` folder and install as the
``hearth_resources`` package, a mapping pyproject.toml's package finder cannot express.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["app", "app.*", "engine", "engine.*"]), "hearth_resources"],
    package_dir={"hearth_resources": "resources"},
)
