"""``--set key=value``: each value converted to its setting's type, strictly for booleans."""

import pytest

from memdiag._errors import UserError
from memdiag.workloads.configs import PRESETS, with_overrides

TINY = PRESETS["transformer"]["tiny"]


@pytest.mark.parametrize("text,expected", [("true", True), ("True", True), ("YES", True), ("1", True),
                                           ("false", False), ("False", False), ("no", False), ("0", False)])
def test_a_boolean_setting_takes_true_false_yes_no_1_0_in_any_case(text, expected):
    assert with_overrides(TINY, {"tie_target_embedding": text}).tie_target_embedding is expected


@pytest.mark.parametrize("text", ["flase", "ture", "", "2", "off-ish"])
def test_a_misspelt_boolean_is_a_one_line_error_that_says_what_to_write(text):
    # GIVEN a typo that a lenient parser would read as False
    with pytest.raises(UserError) as caught:
        with_overrides(TINY, {"tie_target_embedding": text})
    # THEN the run is refused with one line naming the setting and the words it takes
    message = str(caught.value)
    assert "\n" not in message
    assert f"--set tie_target_embedding={text}" in message
    assert "--set tie_target_embedding=true" in message and "--set tie_target_embedding=false" in message


def test_other_settings_still_convert_to_their_type():
    config = with_overrides(TINY, {"vocab_size": "1024", "zipf_exponent": "1.3"})
    assert config.vocab_size == 1024 and config.zipf_exponent == 1.3
    with pytest.raises(UserError, match="expected a int"):
        with_overrides(TINY, {"vocab_size": "many"})
