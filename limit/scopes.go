package limit

import "strings"

// scopeOf returns the scope of key: its text up to its first NUL, "" without one.
func scopeOf(key string) string {
	if i := strings.IndexByte(key, 0); i >= 0 {
		return key[:i]
	}
	return ""
}

// maxScopes bounds the scopes a shard tells apart; the keys of further scopes are counted
// under the first one.
const maxScopes = 4096

// scopes counts the keys of a table by scope, for SetScopes. With share > 0, every scope is
// sure of share keys: committed is the room taken or reserved, the sum over the scopes that
// hold keys of max(held, share), plus share for each of the want scopes not yet holding any.
// A scope below its share may always add a key (its room is reserved); one at or above it
// only while committed < max, that is out of room nobody reserves. So committed never exceeds
// max through additions beyond a share, and no scope is kept below its share by the others.
type scopes struct {
	ids       map[string]uint16
	held      []int
	want      int
	share     int
	committed int
}

// index returns the index of scope, adding it when new.
func (s *scopes) index(scope string) uint16 {
	if i, ok := s.ids[scope]; ok {
		return i
	}
	if len(s.held) >= maxScopes {
		return 0
	}
	if s.ids == nil {
		s.ids = map[string]uint16{}
	}
	i := uint16(len(s.held))
	s.ids[strings.Clone(scope)] = i
	s.held = append(s.held, 0)
	return i
}

// admits reports whether scope i may add a key to a table of size keys.
func (s *scopes) admits(i uint16, size int) bool {
	return s.share == 0 || s.held[i] < s.share || s.committed < size
}

// add counts d (1 or -1) keys of scope i.
func (s *scopes) add(i uint16, d int) {
	h := s.held[i]
	s.held[i] = h + d
	switch {
	case s.share == 0:
	case h == 0 || h+d == 0:
		s.recount() // a scope starts or stops holding keys: the reservations change
	case d > 0 && h >= s.share, d < 0 && h+d >= s.share:
		s.committed += d
	}
}

// setShares divides a table of size keys among want scopes.
func (s *scopes) setShares(want, size int) {
	s.want, s.share = want, 0
	if want >= 2 {
		s.share = max(size/want, 1)
	}
	s.recount()
}

// recount computes committed anew.
func (s *scopes) recount() {
	s.committed = 0
	if s.share == 0 {
		return
	}
	active := 0
	for _, h := range s.held {
		if h > 0 {
			active++
			s.committed += max(h, s.share)
		}
	}
	s.committed += max(s.want-active, 0) * s.share
}
