"""Read GGUF metadata for the minimax-spark modules.

A thin layer over the ``gguf`` package's ``GGUFReader`` (no hand-written parser): it turns the
reader's failures into exceptions whose message says what to fix, converts metadata values to
plain Python values, and knows the split-file naming llama.cpp uses
(``<prefix>-00001-of-00006.gguf``; metadata lives in shard 1).

Modules import it as ``from ansible.module_utils.minimax_spark_gguf import ...``; it needs the
``gguf`` package (and numpy) on the managed node's Python.
"""
from __future__ import annotations

import os
import re
import sys

#: Where the common role copies the controller's ``gguf`` package on nodes (``common_python_dir``);
#: searched when the interpreter cannot import ``gguf`` by itself.
PYTHON_DIR = os.environ.get("MINIMAX_SPARK_PYTHON_DIR", "/opt/minimax-spark/python")

try:
    from gguf import GGUFReader, GGUFValueType

    HAS_GGUF = True
    GGUF_IMPORT_ERROR = None
except ImportError:  # pragma: no cover - exercised only on nodes without a system-wide gguf
    if os.path.isdir(PYTHON_DIR) and PYTHON_DIR not in sys.path:
        sys.path.append(PYTHON_DIR)
    try:
        from gguf import GGUFReader, GGUFValueType

        HAS_GGUF = True
        GGUF_IMPORT_ERROR = None
    except ImportError as exc:
        GGUFReader = GGUFValueType = None
        HAS_GGUF = False
        GGUF_IMPORT_ERROR = exc

#: The four bytes every GGUF file starts with.
GGUF_MAGIC_BYTES = b"GGUF"

#: Metadata keys the project reads (names as llama.cpp writes them).
KEY_ARCHITECTURE = "general.architecture"
KEY_CHAT_TEMPLATE = "tokenizer.chat_template"
KEY_SPLIT_NO = "split.no"  # 0-based: shard 1 of a split model holds 0
KEY_SPLIT_COUNT = "split.count"
KEY_SPLIT_TENSORS_COUNT = "split.tensors.count"

#: A shard of a split model, named the way llama.cpp's ``llama_split_path`` names them
#: ("%s-%05d-of-%05d.gguf", 1-based shard number).
SPLIT_NAME_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
SPLIT_NAME_FORMAT = "{prefix}-{no:05d}-of-{count:05d}.gguf"

_MISSING = object()


class GGUFError(Exception):
    """Base class: something about a GGUF file the caller has to fix."""


class GGUFNotFoundError(GGUFError):
    """The path does not exist or is not a regular file."""


class NotAGGUFError(GGUFError):
    """The file exists but is not a readable GGUF file (wrong magic, truncated, corrupt)."""


class GGUFKeyError(GGUFError):
    """A metadata key the caller needs is not in the file."""

    def __init__(self, path, key, hint=""):
        self.path = path
        self.key = key
        msg = "GGUF file %s has no metadata key %r" % (path, key)
        if hint:
            msg += ": " + hint
        super().__init__(msg)


def split_name_info(path):
    """Return ``(prefix, shard_no, shard_count)`` (1-based shard number) when ``path`` is named
    like a shard of a split model, else ``None``.

    >>> split_name_info("/m/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf")
    ('/m/MiniMax-M3-UD-IQ4_XS', 1, 6)
    """
    match = SPLIT_NAME_RE.match(os.fspath(path))
    if not match:
        return None
    return match.group("prefix"), int(match.group("no")), int(match.group("count"))


def split_shard_paths(path, split_count):
    """All shard paths of the split model whose shard 1 is ``path`` (just ``[path]`` when the
    model is not split). Raises :class:`GGUFError` when a split model's file is not named the way
    llama.cpp expects, since llama.cpp finds the other shards from that name."""
    path = os.fspath(path)
    if split_count <= 1:
        return [path]
    info = split_name_info(path)
    expected_suffix = "-%05d-of-%05d.gguf" % (1, split_count)
    if info is None or info[1] != 1 or info[2] != split_count:
        raise GGUFError(
            "%s is shard 1 of a %d-file split model but is not named '<prefix>%s'; llama.cpp finds "
            "the other shards from that name: give the file its original name" % (path, split_count, expected_suffix)
        )
    prefix = info[0]
    return [SPLIT_NAME_FORMAT.format(prefix=prefix, no=i, count=split_count) for i in range(1, split_count + 1)]


class GGUFMetadata:
    """Metadata of one GGUF file, read with ``gguf.GGUFReader``.

    ``get(key)`` returns plain Python values: ``str`` for strings, ``int``/``float``/``bool`` for
    scalars, lists for arrays. Missing keys raise :class:`GGUFKeyError` unless a default is given.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._reader = open_reader(self.path)

    @property
    def reader(self):
        """The ``gguf.GGUFReader`` of the file, for tensor-level access (names, offsets, sizes)."""
        return self._reader

    # -- generic access ---------------------------------------------------------------------
    def keys(self):
        """Metadata keys in file order (without the reader's synthetic ``GGUF.*`` entries)."""
        return [k for k in self._reader.fields if not k.startswith("GGUF.")]

    def __contains__(self, key):
        return key in self._reader.fields and not key.startswith("GGUF.")

    def value_type(self, key):
        """The GGUF type name of ``key`` (``STRING``, ``UINT32``, ``ARRAY[STRING]``, ...)."""
        field = self._field(key)
        if field.types[0] == GGUFValueType.ARRAY:
            sub = field.types[-1].name if len(field.types) > 1 else "?"
            return "ARRAY[%s]" % sub
        return field.types[0].name

    def get(self, key, default=_MISSING):
        """The value of ``key`` as a Python value, or ``default`` when the key is absent."""
        if key not in self:
            if default is _MISSING:
                raise GGUFKeyError(self.path, key)
            return default
        field = self._reader.fields[key]
        try:
            value = field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            raise NotAGGUFError("GGUF file %s: cannot decode metadata key %r: %s" % (self.path, key, exc)) from exc
        if field.types and field.types[0] == GGUFValueType.BOOL:
            value = bool(value)
        return value

    def get_bytes(self, key):
        """The raw bytes of the string value ``key``, exactly as stored in the file."""
        field = self._field(key)
        if field.types != [GGUFValueType.STRING]:
            raise GGUFError(
                "GGUF file %s: metadata key %r is %s, not a string" % (self.path, key, self.value_type(key))
            )
        return bytes(field.parts[-1].tobytes())

    def arch_get(self, name, default=_MISSING):
        """``<architecture>.<name>``, e.g. ``arch_get("block_count")``."""
        return self.get("%s.%s" % (self.architecture, name), default)

    # -- facts the project uses ---------------------------------------------------------------
    @property
    def architecture(self):
        return self.get(KEY_ARCHITECTURE)

    @property
    def block_count(self):
        return self.arch_get("block_count")

    @property
    def context_length(self):
        return self.arch_get("context_length", None)

    @property
    def expert_count(self):
        return self.arch_get("expert_count", None)

    @property
    def has_chat_template(self):
        return KEY_CHAT_TEMPLATE in self

    @property
    def chat_template_bytes(self):
        """``tokenizer.chat_template`` byte for byte."""
        if KEY_CHAT_TEMPLATE not in self:
            hint = "the model has no built-in chat template"
            if self.split_no != 0:
                hint = "this is shard %d of %d; metadata lives in shard 1" % (self.split_no + 1, self.split_count)
            raise GGUFKeyError(self.path, KEY_CHAT_TEMPLATE, hint)
        return self.get_bytes(KEY_CHAT_TEMPLATE)

    @property
    def chat_template(self):
        try:
            return self.chat_template_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise GGUFError("GGUF file %s: tokenizer.chat_template is not valid UTF-8: %s" % (self.path, exc)) from exc

    @property
    def split_no(self):
        """0-based shard index (``split.no``); 0 for an unsplit file."""
        return int(self.get(KEY_SPLIT_NO, 0))

    @property
    def split_count(self):
        """Number of shards (``split.count``); 1 for an unsplit file."""
        return max(1, int(self.get(KEY_SPLIT_COUNT, 1)))

    @property
    def file_tensor_count(self):
        """Tensors stored in this file."""
        return len(self._reader.tensors)

    @property
    def tensor_count(self):
        """Tensors of the whole model (``split.tensors.count`` for a split model)."""
        if self.split_count > 1:
            return int(self.get(KEY_SPLIT_TENSORS_COUNT, self.file_tensor_count))
        return self.file_tensor_count

    def _field(self, key):
        if key not in self:
            raise GGUFKeyError(self.path, key)
        return self._reader.fields[key]


def open_reader(path):
    """A ``gguf.GGUFReader`` of ``path``; GGUFError (or GGUFNotFoundError) says what is wrong with the file."""
    if not os.path.exists(path):
        raise GGUFNotFoundError("GGUF file %s does not exist" % path)
    if not os.path.isfile(path):
        raise GGUFNotFoundError("%s is not a regular file (expected a .gguf model file)" % path)
    if not HAS_GGUF:
        raise GGUFError(
            "the Python package 'gguf' is needed to read %s (run the common role, which copies it to %s): %s"
            % (path, PYTHON_DIR, GGUF_IMPORT_ERROR)
        )
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise GGUFNotFoundError("cannot read %s: %s" % (path, exc.strerror or exc)) from exc
    if magic != GGUF_MAGIC_BYTES:
        raise NotAGGUFError(
            "%s is not a GGUF file (it starts with %r, a GGUF file starts with %r)" % (path, magic, GGUF_MAGIC_BYTES)
        )
    try:
        return GGUFReader(path, "r")
    except Exception as exc:  # the reader raises ValueError, KeyError, IndexError, ... on bad data
        raise NotAGGUFError(
            "%s has the GGUF magic but cannot be read (truncated download or corrupt file?): %s: %s"
            % (path, type(exc).__name__, exc)
        ) from exc


def open_gguf(path):
    """Open ``path`` and return its :class:`GGUFMetadata`; raises a :class:`GGUFError`."""
    return GGUFMetadata(path)


def read_chat_template(path):
    """``tokenizer.chat_template`` of the GGUF at ``path`` as bytes, exactly as stored."""
    return open_gguf(path).chat_template_bytes


# ------------------------------------------------------------------------------------------------
# Sizes: bytes per layer across all shards, the non-layer tensors, KV bytes per token
# ------------------------------------------------------------------------------------------------

#: ``blk.<N>.<rest>``: a tensor of repeating layer N.
LAYER_TENSOR_RE = re.compile(r"^blk\.(\d+)\.")

#: KV cache types llama.cpp accepts (``--cache-type-k/-v``): (elements per block, bytes per block),
#: as ggml's type traits give them (gguf.constants.GGML_QUANT_SIZES).
KV_CACHE_TYPES = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}


def kv_row_bytes(cache_type, elements):
    """Bytes of ``elements`` values stored as ``cache_type`` (ggml_row_size)."""
    try:
        block, size = KV_CACHE_TYPES[cache_type]
    except KeyError:
        raise GGUFError(
            "unknown KV cache type %r; llama.cpp accepts %s" % (cache_type, ", ".join(sorted(KV_CACHE_TYPES)))
        ) from None
    if elements % block:
        raise GGUFError(
            "KV cache type %s stores blocks of %d values, but a row has %d: choose f16 or q8_0"
            % (cache_type, block, elements)
        )
    return elements // block * size


def _per_layer(value, n_layer):
    """A per-layer hparam stored as a scalar or an array (``get_key_or_arr``)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n_layer:
            raise GGUFError("per-layer array has %d entries for %d layers" % (len(value), n_layer))
        return [int(v) for v in value]
    return [int(value)] * n_layer


def kv_bytes_per_token(meta, cache_type_k="f16", cache_type_v="f16"):
    """KV cache bytes one token (one cell) takes, per layer and in total.

    Follows llama.cpp's ``llama_kv_cache`` (src/llama-kv-cache.cpp): every layer stores
    ``n_head_kv * key_length`` K values and ``n_head_kv * value_length`` V values. For
    ``minimax-m3`` the MSA cache (src/llama-kv-cache-msa.cpp) adds an indexer cache on every layer
    from ``leading_dense_block_count`` on: one head of ``attention.indexer.key_length`` K values
    and one head of ``value_length`` V values (allocated although MSA reads only the keys), in the
    same cache types. Each layer's cache lives on the device that holds the layer.
    """
    n_layer = int(meta.arch_get("block_count"))
    n_embd = int(meta.arch_get("embedding_length"))
    n_head = _per_layer(meta.arch_get("attention.head_count"), n_layer)
    n_head_kv = _per_layer(meta.arch_get("attention.head_count_kv", n_head), n_layer)
    default_head = n_embd // max(1, n_head[0])
    key_length = int(meta.arch_get("attention.key_length", default_head))
    value_length = int(meta.arch_get("attention.value_length", default_head))
    main = [
        kv_row_bytes(cache_type_k, kv * key_length) + kv_row_bytes(cache_type_v, kv * value_length)
        for kv in n_head_kv
    ]
    indexer = [0] * n_layer
    if meta.architecture == "minimax-m3":
        idx_key = meta.arch_get("attention.indexer.key_length", None)
        if idx_key is None:
            raise GGUFKeyError(
                meta.path, "minimax-m3.attention.indexer.key_length",
                "a GGUF made before llama.cpp's sparse attention (PR #24908): download a regenerated one",
            )
        lead = int(meta.arch_get("leading_dense_block_count", 0))
        per = kv_row_bytes(cache_type_k, int(idx_key)) + kv_row_bytes(cache_type_v, value_length)
        indexer = [per if il >= lead else 0 for il in range(n_layer)]
    per_layer = [m + i for m, i in zip(main, indexer)]
    return dict(
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        main=sum(main),
        indexer=sum(indexer),
        total=sum(per_layer),
        per_layer=per_layer,
    )


def tensor_sizes(shards):
    """Bytes of each layer across ``shards`` and of the tensors outside the layers.

    Returns ``(layers, non_layer, data_bytes)``: ``layers`` maps the layer number to its bytes,
    ``non_layer`` the tensor name (``token_embd.weight``, ``output.weight``, ...) to its bytes.
    Checks that every shard holds all its tensor data (a truncated download is named with the
    bytes it lacks).
    """
    layers = {}
    non_layer = {}
    total = 0
    for shard in shards:
        meta = shard if isinstance(shard, GGUFMetadata) else GGUFMetadata(shard)
        reader, path = meta.reader, meta.path
        size = len(reader.data)
        end = 0
        for tensor in reader.tensors:
            nbytes = int(tensor.n_bytes)
            end = max(end, int(tensor.data_offset) + nbytes)
            total += nbytes
            match = LAYER_TENSOR_RE.match(tensor.name)
            if match:
                il = int(match.group(1))
                layers[il] = layers.get(il, 0) + nbytes
            else:
                non_layer[tensor.name] = non_layer.get(tensor.name, 0) + nbytes
        if end > size:
            raise NotAGGUFError(
                "%s is truncated: its tensors end at byte %d but the file has %d (%d bytes missing): "
                "download it again" % (path, end, size, end - size)
            )
    return layers, non_layer, total
