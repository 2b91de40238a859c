#!/usr/bin/env python3
"""check_tfevents.py: reads mgrl's TensorBoard event files with TensorBoard's own reader and prints them.

Needs only `pip install tensorboard` (no TensorFlow: TensorBoard then uses its bundled stub, whose record
reader checks both masked CRC32Cs of every record). Not used by the C++ tests.

    python tools/check_tfevents.py RUN_DIR_OR_EVENT_FILE

Prints every raw event (file_version / scalar) in file order, then the scalars as EventAccumulator sees
them. Exits 1 if a file cannot be read, has no "brain.Event:2" first record, or holds no scalars.
"""
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader


def event_files(path):
    if os.path.isfile(path):
        return [path]
    return sorted(os.path.join(path, f) for f in os.listdir(path) if "tfevents" in f)


def count_frames(path):
    """Records in the file by its framing alone (uint64 length, 4, data, 4): what TensorBoard should load."""
    data = open(path, "rb").read()
    n, at = 0, 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        at += 12 + length + 4
        n += 1
    return n if at == len(data) else -1


def dump_raw(path):
    """Every event of one file, through TensorBoard's record reader (CRC-checked; it stops at a bad record)."""
    events = list(event_file_loader.LegacyEventFileLoader(path).Load())
    frames = count_frames(path)
    print(f"{path}: {len(events)} records loaded, {frames} framed")
    if frames != len(events):
        print(f"{path}: TensorBoard loaded {len(events)} of {frames} records (bad CRC or framing)")
        return None
    for i, ev in enumerate(events):
        what = ev.WhichOneof("what")
        if what == "file_version":
            print(f"  [{i}] wall_time={ev.wall_time:.6f} file_version={ev.file_version!r}")
        elif what == "summary":
            for v in ev.summary.value:
                print(f"  [{i}] wall_time={ev.wall_time:.6f} step={ev.step} tag={v.tag!r} "
                      f"{v.WhichOneof('value')}={getattr(v, v.WhichOneof('value'))!r}")
        else:
            print(f"  [{i}] unexpected event kind {what!r}")
    return events


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    target = sys.argv[1]
    files = event_files(target)
    if not files:
        sys.exit(f"{target}: no event files")
    ok = True
    for f in files:
        events = dump_raw(f)
        if events is None:
            ok = False
        elif not events or events[0].file_version != "brain.Event:2":
            print(f"{f}: first record is not file_version 'brain.Event:2'")
            ok = False

    acc = event_accumulator.EventAccumulator(target, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    print(f"EventAccumulator scalars: {len(tags)} tags")
    for tag in tags:
        shown = tag if len(tag) <= 40 else f"{tag[:20]}...({len(tag)} chars)"
        for s in acc.Scalars(tag):
            print(f"  {shown} step={s.step} value={s.value!r} wall_time={s.wall_time:.6f}")
    if not tags:
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
