"""Which model a request names: the main model (the config's [model]) and the library's other models
(`[[models]]` entries and the GGUF files of `library.folder`), each with its names, devices, stand-in and
keep-alive. Built once from a config; checked as a whole (a name used twice or a stand-in that does not
exist is a ConfigError naming it)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from tray_app.config import Config, ConfigError
from tray_app.library.keep_alive import FOREVER, parse_keep_alive

DEVICES = ("gpu", "cpu")
LATEST = ":latest"  # the tag Ollama reads into a model name that has none
OLLAMA_LIBRARY = "registry.ollama.ai/library/"  # how Ollama spells its own library's names in full


def resolve_name(name: str, known: Collection[str]) -> str | None:
    """The name in `known` that a request's model name means: the name itself, or as Ollama reads names
    (its clients send what `/api/tags` lists): letter case aside, its library's full prefix aside, and with
    its default tag `:latest` or without it. `NAME:TAG` with another tag means a model only where the library
    has that name with that tag. None when it means none."""
    if name in known:
        return name
    wanted = name.strip().lower().removeprefix(OLLAMA_LIBRARY)
    forms = {wanted, wanted.removesuffix(LATEST)}
    if ":" not in wanted.rpartition("/")[2]:
        forms.add(wanted + LATEST)
    return next((candidate for candidate in sorted(known) if candidate.lower() in forms), None)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    aliases: tuple[str, ...]
    main: bool
    chat_format: str = ""
    n_ctx: int = 0
    n_parallel: int = 0
    devices: tuple[str, ...] = DEVICES
    stand_in: str = ""
    keep_alive: float = FOREVER  # seconds after its last request; FOREVER: never unloaded
    preload: bool = False

    def role(self, device: str) -> str:
        """Its worker on `device`: the main model's are "gpu" and "cpu", another's "gpu@name"."""
        return device if self.main else f"{device}@{self.name}"

    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


class Catalog:
    """The models by name and alias; the main model first."""

    def __init__(self, entries: list[ModelEntry]) -> None:
        self.entries = entries
        self._by_name: dict[str, ModelEntry] = {}
        for entry in entries:
            for name in entry.names():
                other = self._by_name.get(name)
                if other is not None and other is not entry:
                    raise ConfigError(f"models: the name {name!r} is used by {other.name} and {entry.name}")
                self._by_name[name] = entry
        for entry in entries:
            if not entry.stand_in:
                continue
            stand_in = self._by_name.get(entry.stand_in)
            if stand_in is None:
                raise ConfigError(f"models: {entry.name}'s stand_in {entry.stand_in!r} is not a model here")
            if stand_in is entry:
                raise ConfigError(f"models: {entry.name} cannot stand in for itself")
            if "gpu" not in stand_in.devices:
                raise ConfigError(f"models: {entry.name}'s stand-in {stand_in.name} may not use the GPU")

    @property
    def main(self) -> ModelEntry:
        return self.entries[0]

    def others(self) -> list[ModelEntry]:
        return self.entries[1:]

    def find(self, name: str | None) -> ModelEntry | None:
        """The model `name` names (any of its names, or as Ollama's clients name it: resolve_name); no name
        at all means the main model."""
        if not name:
            return self.main
        found = self._by_name.get(name)
        if found is None:
            resolved = resolve_name(name, self._by_name)
            found = self._by_name.get(resolved) if resolved is not None else None
        return found

    def stand_in_for(self, entry: ModelEntry) -> ModelEntry | None:
        return self._by_name.get(entry.stand_in) if entry.stand_in else None

    def names(self) -> list[str]:
        return [entry.name for entry in self.entries]


def catalog_from_config(cfg: Config) -> Catalog:
    main_path = cfg.model_path()
    name = cfg.model_name()
    # Its file's names too: what requests called it before it had a name of its own (model.name).
    file_names = (main_path.name, main_path.stem, str(main_path), "default")
    main = ModelEntry(
        name=name,
        path=main_path,
        aliases=tuple(alias for alias in dict.fromkeys(file_names) if alias != name),
        main=True,
        chat_format=cfg.model.chat_format,
        stand_in=cfg.model.stand_in,
    )
    default_keep = _keep_alive(cfg.library.keep_alive, "library.keep_alive")
    entries = [main]
    for number, model in enumerate(cfg.models, 1):
        path = Path(model.path).expanduser()
        if not path.is_file():
            raise ConfigError(f"{cfg.source or 'config'}: models[{number}] ({model.name}): no file {path}")
        keep = _keep_alive(model.keep_alive, f"models[{number}].keep_alive") if model.keep_alive else None
        entries.append(
            ModelEntry(
                name=model.name,
                path=path,
                aliases=tuple(model.aliases),
                main=False,
                chat_format=model.chat_format,
                n_ctx=model.n_ctx,
                n_parallel=model.n_parallel,
                devices=tuple(dict.fromkeys(model.devices)),
                stand_in=model.stand_in,
                keep_alive=default_keep if keep is None else keep,
                preload=model.preload,
            )
        )
    entries += _folder_models(cfg, entries, default_keep)
    return Catalog(entries)


def _folder_models(cfg: Config, known: list[ModelEntry], keep_alive: float) -> list[ModelEntry]:
    """Each GGUF file of `library.folder` not already configured, named by its file name without .gguf."""
    if not cfg.library.folder:
        return []
    folder = Path(cfg.library.folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"{cfg.source or 'config'}: library.folder {folder} is not a folder")
    taken = {entry.path.resolve() for entry in known}
    found = []
    for path in sorted(folder.glob("*.gguf")):
        if path.resolve() in taken or ".mmproj" in path.name or path.name.startswith("mmproj"):
            continue  # configured already, or a vision projector (not a model to chat with)
        found.append(ModelEntry(path.stem, path, (path.name,), False, keep_alive=keep_alive))
    return found


def _keep_alive(value: str, key: str) -> float:
    try:
        return parse_keep_alive(value)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None
