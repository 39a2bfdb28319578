package report

import (
	"fmt"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// A small hand-written SVG plotter: line charts and grouped bar charts,
// no dependencies, byte-identical output for identical input.

const (
	svgW, svgH             = 760, 400
	padL, padR, padT, padB = 64, 170, 36, 48
)

// line is one polyline of a chart.
type line struct {
	name   string
	color  string
	dashed bool
	xs, ys []float64
}

// ticks returns about n round tick values covering [0, hi].
func ticks(hi float64, n int) []float64 {
	if hi <= 0 {
		return []float64{0}
	}
	raw := hi / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ts []float64
	for v := 0.0; v <= hi*1.0001; v += step {
		ts = append(ts, v)
	}
	return ts
}

func label(v float64) string {
	switch {
	case v >= 1e6:
		return trim(v/1e6) + "M"
	case v >= 1e3:
		return trim(v/1e3) + "k"
	}
	return trim(v)
}

func trim(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// frame writes the header, title, axes, grid and axis labels, and returns
// the coordinate mappers.
func frame(w io.Writer, title, xlabel, ylabel string, xmax, ymax float64, xticks bool) (x, y func(float64) float64) {
	pw, ph := float64(svgW-padL-padR), float64(svgH-padT-padB)
	x = func(v float64) float64 { return padL + pw*v/xmax }
	y = func(v float64) float64 { return padT + ph*(1-v/ymax) }
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgW, svgH)
	fmt.Fprintf(w, `<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", padL, esc(title))
	for _, t := range ticks(ymax, 5) {
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", padL, svgW-padR, y(t), y(t))
		fmt.Fprintf(w, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, y(t)+4, label(t))
	}
	if xticks {
		for _, t := range ticks(xmax, 6) {
			fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(t), svgH-padB+16, label(t))
		}
	}
	fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>`+"\n", padL, svgW-padR, svgH-padB, svgH-padB)
	fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>`+"\n", padL, padL, padT, svgH-padB)
	fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(padL+svgW-padR)/2, svgH-10, esc(xlabel))
	fmt.Fprintf(w, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(padT+svgH-padB)/2, esc(ylabel))
	return x, y
}

func legend(w io.Writer, i int, name, color string, dashed, box bool) {
	ly := padT + 8 + 18*i
	lx := svgW - padR + 14
	if box {
		fmt.Fprintf(w, `<rect x="%d" y="%d" width="18" height="10" fill="%s"/>`+"\n", lx, ly-5, color)
	} else {
		dash := ""
		if dashed {
			dash = ` stroke-dasharray="5 3"`
		}
		fmt.Fprintf(w, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", lx, lx+18, ly, ly, color, dash)
	}
	fmt.Fprintf(w, `<text x="%d" y="%d">%s</text>`+"\n", lx+24, ly+4, esc(name))
}

// lineChart writes a line chart of ls with x from 0 to xmax.
func lineChart(w io.Writer, title, xlabel, ylabel string, xmax float64, ls []line) {
	ymax := 0.0
	for _, l := range ls {
		for _, v := range l.ys {
			ymax = max(ymax, v)
		}
	}
	ymax = niceMax(ymax)
	x, y := frame(w, title, xlabel, ylabel, xmax, ymax, true)
	for i, l := range ls {
		var pts strings.Builder
		for k := range l.xs {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(l.xs[k]), y(l.ys[k]))
		}
		dash := ""
		if l.dashed {
			dash = ` stroke-dasharray="5 3"`
		}
		fmt.Fprintf(w, `<polyline fill="none" stroke="%s" stroke-width="1.6"%s points="%s"/>`+"\n", l.color, dash, strings.TrimSpace(pts.String()))
		legend(w, i, l.name, l.color, l.dashed, false)
	}
	fmt.Fprintln(w, "</svg>")
}

// barChart writes grouped bars: values[s][g] is series s in group g.
func barChart(w io.Writer, title, ylabel string, groups, series []string, colors []string, values [][]float64, ymax float64) {
	if ymax <= 0 {
		for _, vs := range values {
			for _, v := range vs {
				ymax = max(ymax, v)
			}
		}
		ymax = niceMax(ymax)
	}
	x, y := frame(w, title, "", ylabel, float64(len(groups)), ymax, false)
	gw := x(1) - x(0)
	bw := gw * 0.8 / float64(len(series))
	// Labels wider than a group (about 6.5 px a character) alternate
	// between two lines so that neighbours do not run together.
	stagger := false
	for _, name := range groups {
		stagger = stagger || 6.5*float64(utf8.RuneCountInString(name)) > gw
	}
	for g, name := range groups {
		ly := svgH - padB + 16
		if stagger && g%2 == 1 {
			ly += 14
		}
		fmt.Fprintf(w, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(float64(g))+gw/2, ly, esc(name))
		for s := range series {
			v := values[s][g]
			if math.IsNaN(v) {
				continue
			}
			bx := x(float64(g)) + gw*0.1 + bw*float64(s)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				bx, y(min(v, ymax)), bw, y(0)-y(min(v, ymax)), colors[s], esc(series[s]), esc(name), trim(v))
		}
	}
	for s, name := range series {
		legend(w, s, name, colors[s], false, true)
	}
	fmt.Fprintln(w, "</svg>")
}

// niceMax rounds v up to a round number for an axis.
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	ts := ticks(v*1.05, 5)
	return ts[len(ts)-1] + (ts[1]-ts[0])*boolf(ts[len(ts)-1] < v*1.05)
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
