package ledger

import (
	"testing"
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
)

// A snapshot recomputed for a retried reply refills the bucket only at the
// rate the shares leave it, as the key itself does.
func TestSnapshotAtCountsShares(t *testing.T) {
	s, err := New(Config{TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lim := ration.Limits{RPM: 600}
	now := bucket.Instant(1_800_000_000_000_000)
	apply := func(cmd Command) *AcquireReply {
		r, _, err := s.Apply(cmd)
		if err != nil {
			t.Fatal(err)
		}
		return r.(*AcquireReply)
	}
	apply(Acquire{Now: now, Caller: Caller{SpenderID: "a", Epoch: 1, Sequence: 1},
		Keys: []AcquireKey{{Key: "k", Limits: lim, Want: ration.Amount{Requests: 600}, Need: ration.Amount{Requests: 600}}}})
	r := apply(Acquire{Now: now, Caller: Caller{SpenderID: "b", Epoch: 1, Sequence: 1},
		Keys: []AcquireKey{{Key: "k", Limits: lim, Demand: ration.Amount{Requests: 6000}}}})
	if r.Keys[0].Share.Requests != ration.ShareUnit {
		t.Fatalf("share %+v, want the whole rate", r.Keys[0].Share)
	}
	if got := s.snapshotAt("k", lim, now.Add(5*time.Second)).Requests.Remaining; got != 0 {
		t.Fatalf("snapshot 5 s later: %d remaining under a share of the whole rate, want 0", got)
	}
}
