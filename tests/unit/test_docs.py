"""The README's configuration reference names every setting the code reads."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from workers.settings import Settings

README = (Path(__file__).parents[2] / "README.md").read_text()


def env_names(model: type[BaseModel], prefix: str = "MEMQ_") -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names += env_names(field.annotation, f"{prefix}{name.upper()}__")
        else:
            names.append(f"{prefix}{name.upper()}")
    return names


def test_every_setting_is_documented():
    # Paths like CA/cert/key files share one row ("..._CERT_FILE").
    missing = [n for n in env_names(Settings) if n not in README and f"..._{n.rsplit('__', 1)[-1]}" not in README]
    assert not missing, f"README lacks: {missing}"


def test_readme_names_the_two_commands():
    assert "bash infra/dev.sh up" in README
    assert "bash infra/dev.sh test" in README
