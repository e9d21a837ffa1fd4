import pytest

from allocscope.allocator.config import settings_items
from allocscope.common.units import format_bytes

pytestmark = pytest.mark.torch_agnostic


def test_alloc_conf_parsing_keeps_bracketed_lists_whole():
    assert settings_items(None) == {}
    assert settings_items("") == {}
    assert settings_items("expandable_segments:True") == {"expandable_segments": "True"}
    assert settings_items(" max_split_size_mb:128 , garbage_collection_threshold:0.6,") == {
        "max_split_size_mb": "128", "garbage_collection_threshold": "0.6"}
    assert settings_items("roundup_power2_divisions:[256:1,512:2,>:8],expandable_segments:False") == {
        "roundup_power2_divisions": "[256:1,512:2,>:8]", "expandable_segments": "False"}


def test_sizes_use_binary_units():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1024) == "1.00 KiB"
    assert format_bytes(3 * 1024**3 // 2) == "1.50 GiB"
    assert format_bytes(-2048) == "-2.00 KiB"
