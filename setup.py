"""Where longrun-runtime's packages live: ``longrun`` under shared/, and the services under services/,
shipped as ``longrun.services`` so the wheel installs no top-level package but its own."""

from setuptools import find_namespace_packages, setup

PACKAGE_DIR = {"": "shared", "longrun.services": "services"}
"""Each package root and the folder it is read from (the Dockerfile copies these folders)."""

if __name__ == "__main__":
    setup(
        packages=[*find_namespace_packages("shared", include=["longrun", "longrun.*"], exclude=["*__pycache__*"]),
                  "longrun.services",
                  *(f"longrun.services.{name}" for name in find_namespace_packages(
                      "services", exclude=["*__pycache__*"]))],
        package_dir=PACKAGE_DIR,
    )
