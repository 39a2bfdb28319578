package leasewire

import (
	"testing"
	"time"

	"github.com/rationhq/ration"
)

func TestRoundTrip(t *testing.T) {
	l := ration.Limits{RPM: 60, TPM: 6000, BurstRequests: 5, BurstTokens: 700, Window: 24 * time.Hour}
	if got := LimitsOf(NewLimits(l)); got != l {
		t.Errorf("limits %+v came back as %+v", l, got)
	}
	a := ration.Amount{Requests: 3, Tokens: 400}
	if got := AmountOf(NewAmount(a)); got != a {
		t.Errorf("amount %+v came back as %+v", a, got)
	}
	if got := AmountOf(nil); got != (ration.Amount{}) {
		t.Errorf("nil amount read as %+v", got)
	}
	if got := LimitsOf(nil); got != (ration.Limits{}) {
		t.Errorf("nil limits read as %+v", got)
	}
	// Beyond the protocol's range an amount saturates: the allocator would
	// refuse the whole call otherwise.
	big := ration.Amount{Requests: ration.MaxAmount + 1, Tokens: -1}
	if got := AmountOf(NewAmount(big)); got != big.Clamp() || got.Requests != ration.MaxAmount {
		t.Errorf("amount %+v sent as %+v, want it clamped to %+v", big, got, big.Clamp())
	}
}

func TestNotLeaderInfo(t *testing.T) {
	if info := NotLeaderInfo("http://a:7450"); info.GetReason() != ration.ReasonNotLeader || info.GetDomain() != ration.ErrorDomain ||
		info.GetMetadata()[ration.MetaLeader] != "http://a:7450" {
		t.Errorf("with a leader: %v", info)
	}
	if info := NotLeaderInfo(""); len(info.GetMetadata()) != 0 {
		t.Errorf("without a leader: metadata %v, want none", info.GetMetadata())
	}
}
