package gateway

import "errors"

// ErrInvalidKeys is wrapped by every error NewKeyring, ParseKeys and
// LoadKeys return for keys that cannot be used.
var ErrInvalidKeys = errors.New("gateway: invalid keys")

// ErrBadUpstream is returned by New and NewProxy when the upstream URL is
// not an absolute http or https URL.
var ErrBadUpstream = errors.New("gateway: bad upstream URL")
