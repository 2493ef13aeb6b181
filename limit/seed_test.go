package limit

import (
	"os"
	"strconv"
)

func seedFromEnv(def uint64) uint64 {
	if s, err := strconv.ParseUint(os.Getenv("SEED"), 10, 64); err == nil {
		return s
	}
	return def
}
