package ledger

import (
	"bytes"
	"reflect"
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// A state restored from its snapshot is the state: given the same
// commands after it, both give the same replies and the same snapshots,
// byte for byte, wherever the history is cut. (A replica that restored a
// snapshot must stay identical to one that applied the log; a holding
// without a share once kept the instant of its last call in memory, which
// a record without shares leaves out, and the two diverged as soon as
// another holding on the key took a share.)
func TestRestoredStateStaysIdentical(t *testing.T) {
	lim := ration.Limits{RPM: 600, TPM: 60_000}
	t0 := bucket.Instant(1_800_000_000_000_000)
	at := func(s int) bucket.Instant { return t0.Add(time.Duration(s) * time.Second) }
	caller := func(id string, seq uint64) Caller { return Caller{SpenderID: id, Epoch: 1, Sequence: seq} }
	want := ration.Amount{Requests: 10, Tokens: 1000}
	demand := ration.Amount{Requests: 300, Tokens: 30_000}
	cmds := []Command{
		Acquire{Now: at(0), Caller: caller("a", 1), Keys: []AcquireKey{{Key: "k", Limits: lim, Want: want}}},
		Acquire{Now: at(1), Caller: caller("b", 1), Keys: []AcquireKey{{Key: "k", Limits: lim, Want: want}}},
		Acquire{Now: at(2), Caller: caller("b", 2), Keys: []AcquireKey{{Key: "k", Limits: lim, Want: want, Demand: demand}}},
		Acquire{Now: at(3), Caller: caller("a", 2), Keys: []AcquireKey{{Key: "k", Limits: lim, Want: want}}},
		ReserveAhead{Now: at(4), Caller: caller("a", 3), Keys: []ReserveKey{{Key: "k", Limits: lim, Cost: want, MaxWait: time.Minute}}},
		Acquire{Now: at(5), Caller: caller("a", 4), Keys: []AcquireKey{{Key: "k", Limits: lim, Want: want, Demand: demand}}},
		Acquire{Now: at(6), Caller: caller("b", 3), Keys: []AcquireKey{{Key: "k", Limits: lim, Want: want}}},
		Sweep{Now: at(30)},
	}
	cfg := Config{TTL: 10 * time.Second}
	for cut := range cmds {
		live, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds[:cut] {
			if _, _, err := live.Apply(c); err != nil {
				t.Fatalf("cut %d: %+v: %v", cut, c, err)
			}
		}
		restored, err := Restore(cfg, live.Snapshot(), at(cut))
		if err != nil {
			t.Fatalf("cut %d: restore: %v", cut, err)
		}
		for i, c := range cmds[cut:] {
			r1, _, err1 := live.Apply(c)
			r2, _, err2 := restored.Apply(c)
			if err1 != nil || err2 != nil {
				t.Fatalf("cut %d, command %d: %v, restored %v", cut, cut+i, err1, err2)
			}
			if !reflect.DeepEqual(r1, r2) {
				t.Fatalf("cut %d, command %d: reply %+v, restored %+v", cut, cut+i, r1, r2)
			}
			if !bytes.Equal(live.Snapshot(), restored.Snapshot()) {
				t.Fatalf("cut %d, after command %d: the restored state's snapshot differs from the live one's", cut, cut+i)
			}
		}
	}
}
