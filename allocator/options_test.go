package allocator

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestOptionsThatDoNotApply: each constructor refuses an option the kind
// of Ledger it makes has no use for, naming the option and the kind, and
// accepts those it has.
func TestOptionsThatDoNotApply(t *testing.T) {
	observer := WithCommitObserver(func(time.Duration, error) {})
	replicated := func(opts ...Option) error {
		_, tr := raft.NewInmemTransport("")
		m, err := NewReplicated(ClusterConfig{ID: "a", Transport: tr}, opts...)
		if err == nil {
			m.Close()
		}
		return err
	}
	open := func(opts ...Option) error {
		l, err := Open(tempDB(t), opts...)
		if err == nil {
			l.Close()
		}
		return err
	}
	memory := func(opts ...Option) error {
		_, err := New(opts...)
		return err
	}
	for _, tc := range []struct {
		name   string
		make   func(...Option) error
		opt    Option
		refuse string // "": accepted; else the option named in the error
		kind   string
	}{
		{"New/WithCommitLinger", memory, WithCommitLinger(time.Millisecond), "WithCommitLinger", "memory-only Ledger (New)"},
		{"New/WithCommitObserver", memory, observer, "WithCommitObserver", "memory-only Ledger (New)"},
		{"New/WithLogger", memory, WithLogger(nil), "WithLogger", "memory-only Ledger (New)"},
		{"New/withClockWait", memory, withClockWait(time.Second), "withClockWait", "memory-only Ledger (New)"},
		{"New/WithTTL", memory, WithTTL(time.Second), "", ""},
		{"Open/withClockWait", open, withClockWait(time.Second), "withClockWait", "durable Ledger (Open)"},
		{"Open/WithCommitObserver", open, observer, "", ""},
		{"Open/WithCommitLinger", open, WithCommitLinger(0), "", ""},
		{"NewReplicated/WithCommitObserver", replicated, observer, "WithCommitObserver", "replicated Ledger (NewReplicated)"},
		{"NewReplicated/withNoSync", replicated, withNoSync(), "withNoSync", "replicated Ledger (NewReplicated)"},
		{"NewReplicated/withApplied", replicated, withApplied(nil), "withApplied", "replicated Ledger (NewReplicated)"},
		{"NewReplicated/WithCommitLinger", replicated, WithCommitLinger(0), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.make(WithTTL(time.Second), tc.opt)
			switch {
			case tc.refuse == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse) || !strings.Contains(err.Error(), tc.kind)):
				t.Fatalf("error %v, want one naming %s and %s", err, tc.refuse, tc.kind)
			}
		})
	}
}
