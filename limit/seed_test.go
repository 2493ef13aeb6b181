package limit

import (
	"os"
	"strconv"
)

// seedFromEnv returns the seed of a randomized test: def, or SEED from the environment to
// explore other sequences (SEED=7 go test -run RedisMatchesMemory ./limit/).
func seedFromEnv(def uint64) uint64 {
	if s, err := strconv.ParseUint(os.Getenv("SEED"), 10, 64); err == nil {
		return s
	}
	return def
}
