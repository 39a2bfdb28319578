// Package version names the build a ration command runs from, for its
// -version flag.
package version

import (
	"runtime/debug"
	"strings"
)

// stamped is the version a release build sets with
//
//	-ldflags "-X github.com/rationhq/ration/internal/version.stamped=v0.3.0"
//
// (deploy/container/build.sh does). No code writes it: the linker fills it in.
var stamped string

// String is the build's version and Go version, e.g. "v0.3.0 go1.26.8":
// the stamped version, else the module version that `go install
// module@version` records, else "(devel)" with the VCS revision when the
// go command recorded one.
func String() string {
	bi, _ := debug.ReadBuildInfo()
	return describe(stamped, bi)
}

func describe(stamped string, bi *debug.BuildInfo) string {
	if bi == nil {
		bi = &debug.BuildInfo{}
	}
	v := stamped
	if v == "" {
		v = bi.Main.Version
	}
	if v == "" || v == "(devel)" {
		v = "(devel)"
		var rev, dirty string
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision":
				rev = s.Value[:min(12, len(s.Value))]
			case s.Key == "vcs.modified" && s.Value == "true":
				dirty = "+dirty"
			}
		}
		if rev != "" {
			v += " " + rev + dirty
		}
	}
	return strings.TrimSpace(v + " " + bi.GoVersion)
}

// Requested reports whether a command's arguments ask for its version
// alone: exactly one argument, -version or --version.
func Requested(args []string) bool {
	return len(args) == 1 && (args[0] == "-version" || args[0] == "--version")
}
