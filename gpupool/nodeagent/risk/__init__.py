"""Risk detection and isolation in the node agent: processes on cards they were not granted."""
