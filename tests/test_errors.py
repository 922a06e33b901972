"""One-line errors: what `first_line` keeps of TensorFlow's many-line messages (plain strings, no TensorFlow)."""

from __future__ import annotations

from train.errors import first_line

GRAPH_ERROR = """Graph execution error:

Detected at node IteratorGetNext defined at (most recent call last):
  File "train/training.py", line 233, in training_call

{{function_node __inference_training_call_512}} corrupted record at 12
\t [[{{node IteratorGetNext}}]] [Op:__inference_training_call_512]"""

STATUS_ERRORS = """2 root error(s) found.
  (0) INVALID_ARGUMENT: indices[3] = 70000 is not in [0, 60000)
\t [[{{node GatherV2}}]]
  (1) INVALID_ARGUMENT: indices[3] = 70000 is not in [0, 60000)
0 successful operations."""


def test_tensorflow_wrapping_is_dropped_to_the_line_that_says_what_went_wrong():
    assert first_line(RuntimeError(GRAPH_ERROR)) == "corrupted record at 12"
    assert first_line(RuntimeError(STATUS_ERRORS)) == "indices[3] = 70000 is not in [0, 60000)"


def test_a_plain_message_keeps_its_first_line_and_an_empty_one_names_the_type():
    assert first_line(OSError("No space left on device\nmore")) == "No space left on device"
    assert first_line(OSError("File exists: runs/default\nmore")) == "File exists: runs/default"  # not a stack frame
    assert first_line(KeyError()) == "KeyError"


def test_a_long_line_is_cut_at_a_word_and_says_so():
    message = "HTTPSConnectionPool(host='storage.googleapis.com', port=443): Max retries exceeded with url"
    assert first_line(ConnectionError(message), 60) == "HTTPSConnectionPool(host='storage.googleapis.com',..."
    assert len(first_line(ConnectionError(message), 60)) <= 60
    assert first_line(ConnectionError(message), len(message)) == message
    assert first_line(ConnectionError("x" * 100), 10) == "xxxxxxx..."


def test_a_long_path_is_cut_inside_rather_than_dropped():
    message = "Failed to open gs://bucket/" + "a" * 200
    assert first_line(OSError(message), 60) == message[:57] + "..."
