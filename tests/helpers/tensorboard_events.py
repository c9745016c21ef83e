"""Reading back the scalars of TensorBoard event files, for the tests of --tensorboard."""
import struct


def scalars(folder):
    """{tag: [(step, value), ...]} of the event files in `folder`: TFRecords (length, its CRC, an Event
    protobuf, its CRC) read here by hand, the Event decoded with tensorboardX's own message classes."""
    from tensorboardX.proto import event_pb2
    scalars = {}
    for path in sorted(folder.iterdir()):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            n, = struct.unpack("<Q", data[pos:pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])
            pos += 12 + n + 4
            for v in event.summary.value:
                scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars
