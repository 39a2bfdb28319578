package version

import (
	"runtime/debug"
	"testing"
)

func TestDescribe(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}
	for _, tc := range []struct {
		name    string
		stamped string
		bi      *debug.BuildInfo
		want    string
	}{
		{"stamped wins", "v0.3.0", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.2.0"}}, "v0.3.0 go1.26.8"},
		{"go install module@version", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.2.0"}}, "v0.2.0 go1.26.8"},
		{"a checkout with VCS stamping", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: rev}, "(devel) 0123456789ab+dirty go1.26.8"},
		{"a checkout without", "", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, "(devel) go1.26.8"},
		{"no build information", "", nil, "(devel)"},
	} {
		if got := describe(tc.stamped, tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestRequested(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{
		{[]string{"-version"}, true},
		{[]string{"--version"}, true},
		{nil, false},
		{[]string{"-version", "-listen", "x"}, false}, // a flag among others is the command's to refuse
		{[]string{"version"}, false},
	} {
		if got := Requested(c.args); got != c.want {
			t.Errorf("Requested(%q) = %v, want %v", c.args, got, c.want)
		}
	}
}
