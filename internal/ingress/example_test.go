package ingress_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/ingress"
)

// Rate-limit an echo app of your own: two requests a minute per API key, decided in this
// process (Options.Limiter nil), with the headers and the 429 of the standalone ingress.
func ExampleMiddleware() {
	cfg, err := config.Parse("app.yaml", []byte(`
upstream: http://127.0.0.1:9000  # unused by the middleware, required by the file
rules:
  - name: per-key
    match: { path: /api/* }
    key: [header:X-API-Key]
    algorithm: token_bucket
    limit: 2
    period: 1m
`), nil)
	if err != nil {
		panic(err)
	}
	mw, err := ingress.Middleware(cfg, ingress.Options{
		Now: func() time.Time { return time.Unix(1700000000, 0) }, // a fixed clock keeps the output stable
	})
	if err != nil {
		panic(err)
	}
	e := echo.New()
	e.Pre(mw) // Pre: the rules see the cleaned path, before routing
	e.GET("/api/hello", func(c echo.Context) error { return c.String(http.StatusOK, "hello") })

	for range 3 {
		req := httptest.NewRequest("GET", "/api/hello", nil)
		req.Header.Set("X-API-Key", "alice")
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, req)
		fmt.Printf("%d RateLimit: %s; Retry-After: %q\n", rec.Code, rec.Header().Get("RateLimit"), rec.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "per-key";r=1;t=30; Retry-After: ""
	// 200 RateLimit: "per-key";r=0;t=60; Retry-After: ""
	// 429 RateLimit: "per-key";r=0;t=60; Retry-After: "30"
}
