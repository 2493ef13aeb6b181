package testenv

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser returns a chromedp context driving Debian's headless chromium (`make test` installs
// it), bounded by timeout and closed when the test ends, with opts added to chromedp's
// defaults. It skips the test without chromium, or fails it in strict mode (CI).
func Browser(t testing.TB, timeout time.Duration, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		unavailable(t, "chromium not found (install: apt-get install -y chromium)")
	}
	all := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), append(all, opts...)...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	ctx, cancel3 := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancel3)
	return ctx
}
