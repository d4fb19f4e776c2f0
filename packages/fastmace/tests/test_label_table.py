"""The label table: well-formed data, labels, aliases and heads."""

from __future__ import annotations

import re

import pytest

from fastmace.models.label_table import (
    UnknownLabelError,
    checkpoint_for_file,
    checkpoints,
    licence_name,
    resolve_label,
)


def test_table_is_well_formed():
    table = checkpoints()
    ids = [c.id for c in table]
    names = ids + [alias for c in table for alias in c.aliases]
    assert len(names) == len(set(names)), "labels and aliases must be unique"
    for checkpoint in table:
        assert re.fullmatch(r"[0-9a-f]{64}", checkpoint.sha256), checkpoint.id
        assert checkpoint.licence in ("MIT", "ASL")
        assert checkpoint.url is None or checkpoint.url.startswith("https://")
        assert checkpoint.url is not None or checkpoint.packaged is not None
        assert checkpoint.url is None or checkpoint.url.endswith("/" + checkpoint.file)
        assert checkpoint.head(None).name == checkpoint.default_head


def test_facts_from_the_spec():
    mh1, head = resolve_label("mh-1")
    assert mh1.sha256 == "a522eb7f59c7879963d41586528f4980baf33e086c94aa92e3eafdeccad3be47"
    assert mh1.url == (
        "https://github.com/ACEsuit/mace-foundations/releases/download/mace_mh_1/mace-mh-1.model"
    )
    assert head.name == "omat_pbe" and head.functional == "PBE/PBE+U"
    assert [h.name for h in mh1.heads] == [
        "omat_pbe", "mp_pbe_refit_add", "matpes_r2scan", "oc20_usemppbe", "spice_wB97M", "omol",
    ]  # fmt: skip
    assert licence_name(mh1.licence).startswith("Academic Software License")
    assert resolve_label("mp0-medium")[0].licence == "MIT"
    assert checkpoint_for_file("MACE-OFF23_small.model").id == "off23-small"


@pytest.mark.parametrize(
    ("label", "checkpoint_id", "head"),
    [
        ("mh-1:omat_pbe", "mh-1", "omat_pbe"),
        ("mh-1:r2scan", "mh-1", "matpes_r2scan"),
        ("MH-1:spice", "mh-1", "spice_wB97M"),
        ("mace-mh-1:omol", "mh-1", "omol"),
        ("mh-0:rgd1", "mh-0", "rgd1_b3lyp"),
        ("mp-0", "mp0-medium", "Default"),
        ("off23-small", "off23-small", "Default"),
    ],
)
def test_labels_heads_and_aliases(label, checkpoint_id, head):
    checkpoint, found = resolve_label(label)
    assert (checkpoint.id, found.name) == (checkpoint_id, head)


def test_every_mh1_head_has_a_functional():
    mh1, _ = resolve_label("mh-1")
    assert all(head.functional for head in mh1.heads)


def test_d3_functionals_follow_the_training_functional():
    """PBE heads get PBE's D3(BJ) parameters, r2SCAN heads r2SCAN's; references that already
    contain dispersion (-D3(BJ), -V) and the EMT demo get none."""
    from fastmace.models.label_table import checkpoints

    for checkpoint in checkpoints():
        for head in checkpoint.heads:
            functional = (head.functional or "").lower()
            expected = {"pbe": "pbe", "r2scan": "r2scan", "b3lyp": "b3-lyp"}.get(
                functional.split("/")[0]
            )
            assert head.d3_functional == expected, (checkpoint.id, head.name)
    assert resolve_label("mh-1:matpes_r2scan")[1].d3_functional == "r2scan"
    assert resolve_label("mpa-0")[1].d3_functional == "pbe"


def test_unknown_label_suggests():
    with pytest.raises(UnknownLabelError, match=r"Did you mean .*mh-1"):
        resolve_label("mh-2")


def test_unknown_head_lists_heads():
    with pytest.raises(UnknownLabelError, match=r"mh-1 has no head .pbe0.*omat_pbe"):
        resolve_label("mh-1:pbe0")
