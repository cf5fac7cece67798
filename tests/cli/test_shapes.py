"""Shapes files: defaults, comments, op-driven columns, and every bad input with file:line: field."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from autotaxer.ops import Op, get_op
from autotaxer.shapes import DuplicateShapeWarning, ShapeRow, ShapesError, load_shapes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(tmp_path, text: str, name: str = "shapes.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_example_file():
    rows = load_shapes(EXAMPLES / "shapes_cpu.csv", world_size=2)
    assert [(r.op, r.dtype, r.shape, r.layout, r.line) for r in rows] == [
        ("ag_gemm", "fp32", {"M": 64, "N": 256, "K": 256}, {"gather_dim": 0}, 3),
        ("ag_gemm", "fp32", {"M": 512, "N": 256, "K": 512}, {"gather_dim": 0}, 4),
        ("ag_gemm", "fp32", {"M": 256, "N": 512, "K": 256}, {"gather_dim": 1}, 5),
    ]


def test_defaults_comments_blank_lines_and_key(tmp_path):
    path = write(tmp_path, "# tuned shapes\n\nM, N, K\n  # a comment\n16,8192,8192\n\n1024,28672,8192\n")
    rows = load_shapes(path)
    assert [(r.op, r.dtype, r.layout, r.line) for r in rows] == [
        ("ag_gemm", "bf16", {"gather_dim": 0}, 5),
        ("ag_gemm", "bf16", {"gather_dim": 0}, 7),
    ]
    key = rows[1].to_key("nvidia-h200", 2)
    assert key.text == "ag_gemm|nvidia-h200|2|bf16|M=1024,N=28672,K=8192|gather_dim=0"


def test_empty_optional_cells_take_defaults(tmp_path):
    rows = load_shapes(write(tmp_path, "op,M,N,K,dtype,gather_dim\n,8,16,32,,\n"))
    assert (rows[0].op, rows[0].dtype, rows[0].layout) == ("ag_gemm", "bf16", {"gather_dim": 0})


@pytest.mark.parametrize(
    "text, line, field, message",
    [
        ("M,N,K\n64,256,abc\n", 2, "K", "not an integer: 'abc'"),
        ("M,N,K\n64,256,1.5\n", 2, "K", "not an integer: '1.5'"),
        ("M,N\n64,256\n", 2, "K", "missing column (op 'ag_gemm' needs M,N,K)"),
        ("M,N,K\n0,256,256\n", 2, "M", "must be positive, got 0"),
        ("M,N,K\n64,-256,256\n", 2, "N", "must be positive, got -256"),
        ("M,N,K\n64,,256\n", 2, "N", "missing value"),
        ("op,M,N,K\nag_gemmm,64,256,256\n", 2, "op", "unknown op 'ag_gemmm'"),
        (
            "M,N,K,dtype\n64,256,256,int8\n",
            2,
            "dtype",
            "unknown dtype 'int8' (expected one of bf16, fp16, fp32)",
        ),
        ("M,N,K,gather_dim\n64,256,256,2\n", 2, "gather_dim", "must be one of 0, 1, got 2"),
        ("M,N,K,gather_dim\n64,256,256,x\n", 2, "gather_dim", "not an integer: 'x'"),
        ("M,N,K\n64,256\n", 2, None, "expected 3 fields (M,N,K), got 2"),
        ("M,N,K,Q\n64,256,256,1\n", 1, "Q", "unknown column"),
        ("M,N,K,M\n64,256,256,1\n", 1, "M", "column appears twice in header"),
        ("64,256,256\n", 1, None, "missing header line"),
        ("# only a comment\n\n", None, None, "empty file (no header line)"),
        ("M,N,K\n", None, None, "no shapes (only a header)"),
    ],
)
def test_bad_rows(tmp_path, text, line, field, message):
    path = write(tmp_path, "# header comment\n" + text)
    with pytest.raises(ShapesError) as e:
        load_shapes(path)
    err = e.value
    expected_line = None if line is None else line + 1
    assert (err.path, err.line, err.field) == (path, expected_line, field)
    where = path if expected_line is None else f"{path}:{expected_line}"
    what = f" field {field!r}:" if field else ""
    assert str(err).startswith(f"{where}:{what} {message}")


def test_message_format_matches_issue(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shapes.csv").write_text("op,M,N,K\n\n# comment\nag_gemm,8,8,8\n\nag_gemm,8,8,abc\n")
    with pytest.raises(ShapesError, match=r"^shapes\.csv:6: field 'K': not an integer: 'abc'$"):
        load_shapes("shapes.csv")


def test_not_text(tmp_path):
    path = tmp_path / "shapes.csv"
    path.write_bytes(b"SQLite format 3\x00\x10\x00\x01\x01")
    with pytest.raises(ShapesError, match=r"shapes\.csv: not a text file"):
        load_shapes(path)
    path.write_bytes(b"M,N,K\n\xff\xfe8,8,8\n")
    with pytest.raises(ShapesError, match="not a text file"):
        load_shapes(path)
    with pytest.raises(ShapesError, match="cannot read"):
        load_shapes(tmp_path / "absent.csv")


@pytest.mark.parametrize(
    "row, world_size, field, fragment",
    [
        ("6,8,8,0", 4, "M", "6 is not divisible by world size 4"),
        ("8,8,6,1", 4, "K", "6 is not divisible by world size 4"),
    ],
)
def test_divisibility_checked_once_world_size_known(tmp_path, row, world_size, field, fragment):
    path = write(tmp_path, f"M,N,K,gather_dim\n8,8,8,0\n{row}\n")
    assert len(load_shapes(path)) == 2  # fine without a world size
    with pytest.raises(ShapesError) as e:
        load_shapes(path, world_size=world_size)
    assert (e.value.line, e.value.field) == (3, field)
    assert str(e.value).startswith(f"{path}:3: field '{field}': {fragment}")


def test_bad_world_size_argument(tmp_path):
    with pytest.raises(ValueError, match="world_size"):
        load_shapes(write(tmp_path, "M,N,K\n8,8,8\n"), world_size=0)


def test_duplicates_warned_and_dropped(tmp_path):
    path = write(tmp_path, "M,N,K,dtype,gather_dim\n8,8,8,bf16,0\n8,8,8,,\n16,8,8,bf16,0\n8,8,8,fp16,0\n")
    with pytest.warns(DuplicateShapeWarning, match=r"shapes\.csv:3: duplicate of line 2; ignored"):
        rows = load_shapes(path)
    assert [r.line for r in rows] == [2, 4, 5]


def test_no_warning_without_duplicates(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_shapes(write(tmp_path, "M,N,K\n8,8,8\n16,8,8\n"))


class _FakeDecode(Op):
    """A future op with other columns: the parser must follow its shape_fields and layout_choices."""

    name = "fake_decode"
    shape_fields = ("B", "H", "Hkv", "D", "S")
    layout_choices = {"split": (1, 2, 4)}

    def validate(self, key):
        if key["H"] % key["Hkv"]:
            raise ValueError(f"H: {key['H']} is not a multiple of Hkv={key['Hkv']}")

    def make_inputs(self, key, rank, device, seed):
        raise NotImplementedError

    def reference(self, key, rank, device, seed):
        raise NotImplementedError

    def empty_output(self, key, device):
        raise NotImplementedError


def test_columns_come_from_the_op(tmp_path, monkeypatch):
    from autotaxer import ops

    get_op("ag_gemm")  # load built-ins before adding the fake op
    monkeypatch.setitem(ops._OPS, "fake_decode", _FakeDecode())
    text = (
        "op,M,N,K,B,H,Hkv,D,S,split\n"
        "fake_decode,,,,4,32,8,128,4096,\n"
        "ag_gemm,8,8,8,,,,,,\n"
        "fake_decode,,,,1,32,8,128,4096,4\n"
    )
    rows = load_shapes(write(tmp_path, text), world_size=2)
    assert rows[0] == ShapeRow(
        "fake_decode", "bf16", {"B": 4, "H": 32, "Hkv": 8, "D": 128, "S": 4096}, {"split": 1}, 2
    )
    assert rows[1].op == "ag_gemm" and rows[2].layout == {"split": 4}
    assert rows[0].to_key("nvidia-h200", 2).shape_text == "B=4,H=32,Hkv=8,D=128,S=4096"
    bad = write(tmp_path, "op,B,H,Hkv,D,S,M\nfake_decode,1,30,8,128,4096,\n", "b.csv")
    with pytest.raises(ShapesError, match=r"b\.csv:2: field 'H': 30 is not a multiple of Hkv=8"):
        load_shapes(bad, world_size=2)
    other = write(tmp_path, "op,B,H,Hkv,D,S,M\nfake_decode,1,32,8,128,4096,64\n", "c.csv")
    with pytest.raises(ShapesError, match=r"c\.csv:2: field 'M': not a field of op 'fake_decode'"):
        load_shapes(other)
