//go:build unix

package ration

import (
	"os"
	"syscall"
)

// ownedByRoot reports whether uid 0 owns the file fi describes.
func ownedByRoot(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0
}
