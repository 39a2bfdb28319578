package bucket

import "errors"

var (
	// ErrInvalidLimit is returned by Limit.Validate, New, FromState and
	// Bucket.SetLimit when a Limit has a non-positive field, a period that
	// is not a whole number of microseconds, or values too large for exact
	// arithmetic.
	ErrInvalidLimit = errors.New("invalid limit")

	// ErrInvalidState is returned by FromState when a stored level lies
	// outside [-MaxScaled, capacity].
	ErrInvalidState = errors.New("invalid bucket state")
)
