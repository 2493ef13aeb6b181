package admin

import (
	"embed"
	"io/fs"
	"net/http"
)

// uiFiles is the dashboard: one HTML page with its script and styles, no external assets, so it
// works with no network and no CDN.
//
//go:embed ui
var uiFiles embed.FS

// uiHandler serves the dashboard under /ui/. No other page may frame it (X-Frame-Options,
// frame-ancestors), so a page cannot trick an operator into clicking its buttons.
func uiHandler() http.Handler {
	sub, _ := fs.Sub(uiFiles, "ui")
	files := http.StripPrefix("/ui/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		files.ServeHTTP(w, r)
	})
}
