"""gpumem.make_resource, describe_config and reinitialize: GPUMEM_CONF's grammar from
Python (docs/configuration.md), with keywords for the options."""

import pytest

import gpumem


def test_describe_config_names_the_stack():
    assert gpumem.describe_config("pool,stats") == gpumem.describe_config("pool", stats=True)
    text = gpumem.describe_config("pool", stats=True, maximum="1G", log=None)
    assert "stats(" in text and "pool" in text, text


def test_watch_captures_is_a_flag_of_the_pools():
    assert gpumem.describe_config("default", watch_captures=True) == "default"
    mr = gpumem.make_resource("default", 0, watch_captures=True)
    p = mr.allocate(1 << 20, None)
    mr.deallocate(p, 1 << 20, None)
    with pytest.raises(gpumem.LogicError, match="applies to pool or vmm"):
        gpumem.make_resource("async", 0, watch_captures=True)


def test_a_bad_string_is_a_logic_error_naming_the_token():
    with pytest.raises(gpumem.LogicError, match="heap"):
        gpumem.make_resource("heap")
    with pytest.raises(gpumem.LogicError, match="initail"):
        gpumem.describe_config("pool", initail="1G")


def test_make_resource_builds_a_working_stack():
    mr = gpumem.make_resource("pool", 0, maximum="64MiB")
    p = mr.allocate(1 << 20, None)
    mr.deallocate(p, 1 << 20, None)
    with pytest.raises(gpumem.OutOfMemoryError):
        mr.allocate(128 << 20, None)


def test_reinitialize_sets_every_device_and_a_bad_string_changes_nothing():
    before = [gpumem.get_current_resource(d) for d in range(gpumem.device_count())]
    try:
        with pytest.raises(gpumem.LogicError):
            gpumem.reinitialize("pool", maximum="lots")
        assert all(gpumem.get_current_resource(d) is before[d] for d in range(len(before)))
        gpumem.reinitialize("pool", maximum="64MiB")
        for d in range(gpumem.device_count()):
            mr = gpumem.get_current_resource(d)
            assert mr is not before[d]
            with pytest.raises(gpumem.OutOfMemoryError):
                gpumem.DeviceBuffer(128 << 20, device=d)
        gpumem.reinitialize(devices=0)  # the default stack, for device 0 only
        assert isinstance(gpumem.get_current_resource(0), gpumem.VmmPoolResource)
    finally:
        for d in range(len(before)):
            gpumem.set_current_resource(None, d)


def test_memory_info_sees_through_adaptors_and_a_limit_caps_it():
    previous = gpumem.get_current_resource(0)
    try:
        gpumem.set_current_resource(gpumem.make_resource("pool", 0, stats=True, track=True), 0)
        free, total = gpumem.memory_info(0)
        assert 0 < free <= total
        gpumem.set_current_resource(gpumem.make_resource("vmm", 0, limit="64MiB", stats=True), 0)
        buf = gpumem.DeviceBuffer(16 << 20, device=0)
        free, total = gpumem.memory_info(0)
        assert free == (64 << 20) - (16 << 20), free
        del buf
    finally:
        gpumem.set_current_resource(previous, 0)
