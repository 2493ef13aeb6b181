package worker

import "time"

// SetRunningAfter sets how long p lets a first delivery run before recording it as running
// (runningAfter). Call it before Run.
func SetRunningAfter(p *Pool, d time.Duration) { p.runningAfter = d }
