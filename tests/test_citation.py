"""validation/citation.py: a plan cites a published figure only when it is that cell - the model dimension for
dimension, the method, the GPU and the table's other conditions."""
from __future__ import annotations

import shutil

import pytest

from vdkit.cli import main
from vdkit.composition.config import compose
from vdkit.errors import UserError
from vdkit.validation import citation, tables

CELL = ["model=llama2_7b", "method=lora", "model.hf_path=null"]  # Table 9: 79 min on 8 H100s


def test_the_published_cell_is_cited():
    figure = citation.published_for(compose(CELL))
    assert figure is not None and figure.table == "Table 9" and figure.minutes == 79


@pytest.mark.parametrize("change", ["model.num_layers=1000000000", "model.num_layers=33", "model.vocab_size=32064",
                                    "model.rope_base=500000", "model.tied_embeddings=true"])
def test_a_model_that_is_no_longer_the_published_one_cites_nothing(change):
    assert citation.published_for(compose(CELL + [change])) is None


def test_paths_of_the_same_weights_do_not_change_the_cell():
    assert citation.published_for(compose(CELL + ["model.nemo_path=/elsewhere/llama2-7b.nemo"])) is not None


@pytest.mark.parametrize("gpu", ["cluster=xe9680_h200", "cluster.gpu_type=A100-SXM4-80GB"])
def test_another_gpu_cites_nothing(gpu):
    assert citation.published_for(compose(CELL + [gpu])) is None


def test_plan_of_a_billion_layers_prints_no_published_line(capsys):
    assert main(["plan", "model=llama2_7b", "model.num_layers=1000000000"]) == 0
    assert "published" not in capsys.readouterr().out
    assert main(["plan", "model=llama2_7b"]) == 0
    assert "published   Table 9: 79 min" in capsys.readouterr().out


def test_a_table_citing_its_recipes_names_their_gpu(tmp_path):
    published = tmp_path / "published"
    shutil.copytree(tables.PUBLISHED_DIR, published)
    text = (published / "table9.yaml").read_text()
    assert "cluster.gpu_type: H100-SXM5-80GB, " in text
    (published / "table9.yaml").write_text(text.replace("cluster.gpu_type: H100-SXM5-80GB, ", ""))
    with pytest.raises(UserError, match="names its recipes but not the GPU its figures were measured on"):
        tables.spec("table9", published)


@pytest.mark.parametrize("name", tables.table_names())
def test_every_shipped_table_that_cites_names_its_gpu(name):
    pub = tables.spec(name)
    assert not pub.get("recipe") or pub["recipe"].get("cluster.gpu_type")
