package cluster

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// The adapter maps hclog's levels onto slog's, filters by the handler's
// level, and carries With arguments and Named names.
func TestHclogAdapter(t *testing.T) {
	var buf syncBuffer
	l := newHclog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if l.IsDebug() || l.IsTrace() || !l.IsInfo() || !l.IsError() || l.GetLevel() != hclog.Info {
		t.Fatalf("levels: debug %v trace %v info %v level %v", l.IsDebug(), l.IsTrace(), l.IsInfo(), l.GetLevel())
	}
	l.Debug("hidden")
	l.Trace("hidden too")
	sub := l.Named("raft").Named("snap").With("peer", "n2")
	sub.Warn("slow", "ms", 12)
	sub.Log(hclog.Off, "never")
	l.Error("failed", "err", "boom")
	out := buf.String()
	for _, want := range []string{`level=WARN msg=slow peer=n2 logger=raft.snap ms=12`, `level=ERROR msg=failed err=boom`} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hidden") || strings.Contains(out, "never") {
		t.Fatalf("filtered lines logged:\n%s", out)
	}
	if sub.Name() != "raft.snap" || len(sub.ImpliedArgs()) != 2 || l.ResetNamed("x").Name() != "x" {
		t.Fatalf("name %q, implied %v", sub.Name(), sub.ImpliedArgs())
	}
	l.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Warn}).Print("std")
	if !strings.Contains(buf.String(), "level=WARN msg=std") {
		t.Fatalf("standard logger:\n%s", buf.String())
	}
}

// raft's arguments come out readable: a format-style value formatted
// (raft logs its configurations with hclog.Fmt), a duration as a
// duration, raft itself by its String method, keys in snake case, a value
// without a key kept as "extra"; With's arguments alike.
func TestHclogReadableFields(t *testing.T) {
	var buf syncBuffer
	l := newHclog(slog.New(slog.NewJSONHandler(&buf, nil))).With("last-leader-id", hclog.Quote("n1"))
	servers := []raft.Server{{ID: "a", Address: "10.0.0.1:7451"}}
	l.Info("initial configuration", "servers", hclog.Fmt("%+v", servers), "backoff time", 500*time.Millisecond,
		"follower", stringer("Node at 10.0.0.1:7451 [Follower]"), "mask", hclog.Hex(255), "stray")
	want := `"last_leader_id":"\"n1\"","servers":"[{Suffrage:Voter ID:a Address:10.0.0.1:7451}]","backoff_time":"500ms",` +
		`"follower":"Node at 10.0.0.1:7451 [Follower]","mask":"0xff","extra":"stray"}`
	if !strings.Contains(buf.String(), want) {
		t.Fatalf("got %s\nwant ...%s", buf.String(), want)
	}
}

type stringer string

func (s stringer) String() string { return string(s) }
