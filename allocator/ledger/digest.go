package ledger

import (
	"encoding/binary"

	"github.com/rationhq/ration"
)

// digest is a 64-bit multiply-xorshift hash over a call's fields, a word
// at a time: a retry must carry the same body as the call it repeats. It
// is stable across processes and versions (it is stored), and it is not
// cryptographic: it catches client bugs, not adversaries.
type digest uint64

const (
	digestSeed  digest = 0x243f6a8885a308d3
	digestPrime digest = 0x9e3779b97f4a7c15
)

func newDigest(kind callKind) digest { return digestSeed.u64(uint64(kind)) }

func (d digest) u64(v uint64) digest {
	d = (d ^ digest(v)) * digestPrime
	return d ^ d>>29
}

func (d digest) str(s string) digest {
	d = d.u64(uint64(len(s)))
	for len(s) >= 8 {
		d = d.u64(binary.LittleEndian.Uint64([]byte(s[:8])))
		s = s[8:]
	}
	var tail uint64
	for i := 0; i < len(s); i++ {
		tail |= uint64(s[i]) << (8 * i)
	}
	return d.u64(tail)
}

func (d digest) amount(a ration.Amount) digest {
	return d.u64(uint64(a.Requests)).u64(uint64(a.Tokens))
}

func (d digest) limits(l ration.Limits) digest {
	return d.u64(uint64(l.RPM)).u64(uint64(l.TPM)).u64(uint64(l.BurstRequests)).u64(uint64(l.BurstTokens)).u64(uint64(l.Window))
}

// digestDemand marks a key's demand in an Acquire digest.
const digestDemand = 0xde3a4d

func digestAcquire(keys []AcquireKey) digest {
	d := newDigest(kindAcquire).u64(uint64(len(keys)))
	for i := range keys {
		k := &keys[i]
		d = d.str(k.Key).limits(k.Limits).amount(k.Want).amount(k.Need).amount(k.SpendRate).
			amount(k.Returned).amount(k.Held).amount(k.Debt)
		if k.Demand != (ration.Amount{}) {
			// Only when sent: a call without shares digests as it always did,
			// so retries of calls stored before shares existed still match.
			d = d.u64(digestDemand).amount(k.Demand)
		}
	}
	return d
}

func digestReserve(keys []ReserveKey) digest {
	d := newDigest(kindReserve).u64(uint64(len(keys)))
	for i := range keys {
		k := &keys[i]
		d = d.str(k.Key).limits(k.Limits).amount(k.Cost).u64(uint64(k.MaxWait))
	}
	return d
}

func digestRelease(keys []ReleaseKey) digest {
	d := newDigest(kindRelease).u64(uint64(len(keys)))
	for i := range keys {
		k := &keys[i]
		d = d.str(k.Key).limits(k.Limits).amount(k.Returned).amount(k.Debt)
	}
	return d
}
