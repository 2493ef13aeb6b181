package httphdr

import "time"

// SFString writes s as a structured-field string (RFC 9651 3.3.3), the form of a policy name
// in the RateLimit and RateLimit-Policy fields. Bytes outside printable ASCII cannot be
// written and become "?".
func SFString(s string) string { return string(AppendSFString(make([]byte, 0, len(s)+2), s)) }

// AppendSFString appends s as SFString writes it.
func AppendSFString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// CeilSeconds returns d in whole seconds, rounded up; 0 for d <= 0: the unit of the
// RateLimit fields' t and w and of Retry-After.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}
