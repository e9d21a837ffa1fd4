"""Which baseline says the devices' memory as a run ended
(capture/baselines.closing_baseline): the end's, else (a process killed
before it could write one) the last that read the devices, else the start's."""

from allocscope.capture.baselines import closing_baseline, device_readings, outside_allocator


class Capture:
    def __init__(self, *baselines):
        self.baselines = list(baselines)

    def baseline(self, label):
        return next((b for b in self.baselines if b.get("label") == label), None)

    def recording_start(self):
        return self.baseline("start")


def reading(label, used, reserved):
    return {"label": label, "devices": [{"used": used, "total": 100, "stats": {"reserved_bytes": {"current": reserved}}}]}


def test_the_end_baseline_when_there_is_one():
    end = reading("end", 50, 10)
    assert closing_baseline(Capture({"label": "start"}, reading("settings", 30, 5), end)) is end


def test_a_killed_process_has_its_last_reading_of_the_devices():
    last = reading("settings", 40, 8)
    cap = Capture({"label": "start", "devices": []}, reading("settings", 30, 5), last, {"label": "oom"})
    assert closing_baseline(cap) is last and outside_allocator(last) == 32
    # and the card's size from the first that read the devices
    assert device_readings(cap) is cap.baselines[1]


def test_without_any_reading_the_start():
    start = {"label": "start"}
    assert closing_baseline(Capture(start, {"label": "settings"})) is start
    assert closing_baseline(Capture()) is None
