package ration

// Amount is a quantity in both dimensions of a key's budget: whole
// requests (against RPM) and whole tokens (against TPM). A request's cost
// is an Amount (usually 1 request and its estimated tokens), and so is
// every grant, holding, return and debt in the lease protocol.
type Amount struct {
	Requests int64 // requests, counted against Limits.RPM
	Tokens   int64 // tokens, counted against Limits.TPM
}

// Add returns a+b.
func (a Amount) Add(b Amount) Amount {
	return Amount{Requests: a.Requests + b.Requests, Tokens: a.Tokens + b.Tokens}
}

// Sub returns a-b.
func (a Amount) Sub(b Amount) Amount {
	return Amount{Requests: a.Requests - b.Requests, Tokens: a.Tokens - b.Tokens}
}

// Max returns the larger of a and b in each dimension.
func (a Amount) Max(b Amount) Amount {
	return Amount{Requests: max(a.Requests, b.Requests), Tokens: max(a.Tokens, b.Tokens)}
}

// Min returns the smaller of a and b in each dimension.
func (a Amount) Min(b Amount) Amount {
	return Amount{Requests: min(a.Requests, b.Requests), Tokens: min(a.Tokens, b.Tokens)}
}

// Positive returns a with negative fields set to 0.
func (a Amount) Positive() Amount { return a.Max(Amount{}) }

// Negative reports whether a field of a is below 0.
func (a Amount) Negative() bool { return a.Requests < 0 || a.Tokens < 0 }

// Clamp returns a with each field limited to [0, MaxAmount], the range the
// lease protocol carries: absurd values saturate instead of overflowing the
// sums they are added to.
func (a Amount) Clamp() Amount {
	return Amount{Requests: min(max(0, a.Requests), MaxAmount), Tokens: min(max(0, a.Tokens), MaxAmount)}
}
