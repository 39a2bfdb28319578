package allocator

import "os"

func osMkdirTemp() (string, error) { return os.MkdirTemp("", "ration-prop-") }
func osRemoveAll(dir string)       { os.RemoveAll(dir) }
