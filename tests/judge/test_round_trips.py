"""Cases rebuild exactly from their JSON: replay, the regression corpus and the fixtures rely on it."""
import json

import pytest
import torch
from hypothesis import given, settings

from attention_oracle.checks.catalogue import load_case
from attention_oracle.checks.dsa.cases import dsa_cases
from attention_oracle.checks.index.cases import index_cases
from attention_oracle.fixtures.dsa import FIXTURES
from attention_oracle.run import corpus, fuzzing


def _same(case):
    again = load_case(json.loads(case.to_json()))
    assert again == case and again.to_json() == case.to_json()


@settings(max_examples=30, database=None)
@given(case=dsa_cases((torch.float32, torch.float16), rope=True, varlen=True, poison=True)
       | dsa_cases((torch.float32,), rope=False, empty_rows=True, duplicates=True))
def test_dsa_cases_round_trip(case):
    _same(case)


@settings(max_examples=30, database=None)
@given(case=index_cases())
def test_index_cases_round_trip(case):
    _same(case)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_cases_round_trip(name):
    for case in (FIXTURES[name].cpu, FIXTURES[name].gpu):
        _same(case)


def test_corpus_round_trips():
    for _name, entry in corpus.entries(fuzzing.corpus_dir()):
        _same(load_case(entry["case"]))
