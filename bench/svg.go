package bench

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// The plot: two panels sharing a log2 block-size axis, GB/s above and
// million blocks per second below, both on log10 axes because the values
// span several decades across the sweep.

const (
	svgWidth    = 960
	svgHeight   = 780
	plotLeft    = 90.0 // room for y tick labels and the axis title
	plotRight   = 930.0
	panelTop1   = 88.0
	panelBot1   = 360.0
	panelTop2   = 412.0
	panelBot2   = 684.0
	fontFamily  = "Helvetica, Arial, sans-serif"
	colorB2BD   = "#1f5fa8"
	colorRate   = "#23845f"
	colorPerf   = "#d9730d"
	colorYard   = "#6b6b6b"
	colorGrid   = "#e3e3e3"
	colorMinor  = "#f1f1f1"
	colorAxis   = "#333333"
	colorTextLo = "#555555"
)

// point is one (block size, value) of a series; lo and hi draw a whisker.
type point struct {
	x          float64 // block bytes
	y          float64
	lo, hi     float64 // 0: none
	hollow     bool    // fewer blocks than requested
	hasWhisker bool
}

type series struct {
	name   string
	color  string
	marker string // "circle", "square", "none"
	dashed bool
	points []point
}

type panel struct {
	title      string
	yLabel     string
	top, bot   float64
	series     []series
	hline      *hline
	yLo, yHi   float64 // log10 range
	ticks      []float64
	minorTicks []float64
}

// hline is a reference level across the whole panel (the TCP yardstick).
type hline struct {
	y     float64
	name  string
	color string
}

// xAxis maps block sizes to pixels on a log2 scale.
type xAxis struct{ lo, hi float64 } // log2 range

func (a xAxis) px(bytes float64) float64 {
	return plotLeft + (math.Log2(bytes)-a.lo)/(a.hi-a.lo)*(plotRight-plotLeft)
}

func (p *panel) py(v float64) float64 {
	return p.bot - (math.Log10(v)-p.yLo)/(p.yHi-p.yLo)*(p.bot-p.top)
}

// WriteSVG draws the report's rows.
func WriteSVG(w io.Writer, rep *Report) error {
	var b bytes.Buffer
	renderSVG(&b, rep)
	_, err := w.Write(b.Bytes())
	return err
}

// WriteSVGFile writes the plot to path atomically.
func WriteSVGFile(path string, rep *Report) error {
	var b bytes.Buffer
	renderSVG(&b, rep)
	return writeFileAtomic(path, b.Bytes())
}

func renderSVG(b *bytes.Buffer, rep *Report) {
	rows := make([]Row, 0, len(rep.Rows))
	for _, r := range rep.Rows {
		// One op per plot: the run's first (write, unless --op read).
		if r.MedianSeconds > 0 && r.BlockBytes > 0 && r.opOrWrite() == rep.Rows[0].opOrWrite() {
			rows = append(rows, r)
		}
	}
	x := newXAxis(rows)

	gb := series{name: "b2bd BatchTransfer (median)", color: colorB2BD, marker: "circle"}
	rate := series{name: "b2bd BatchTransfer (median)", color: colorRate, marker: "circle"}
	perf := series{name: "ib_write_bw (perftest)", color: colorPerf, marker: "square", dashed: true}
	yard := series{name: "TCP loopback yardstick, 1 connection, interleaved (median)", color: colorYard, marker: "square", dashed: true}
	for _, r := range rows {
		bytesPer := float64(r.BlockBytes) * float64(r.Blocks)
		gbp := point{x: float64(r.BlockBytes), y: r.GBps, hollow: r.Capped}
		rp := point{x: float64(r.BlockBytes), y: r.MblocksPerSec, hollow: r.Capped}
		// Whiskers span the fastest to the slowest timed batch.
		if r.MinSeconds > 0 && r.P99Seconds > 0 {
			gbp.lo, gbp.hi, gbp.hasWhisker = bytesPer/r.P99Seconds/1e9, bytesPer/r.MinSeconds/1e9, true
			rp.lo, rp.hi, rp.hasWhisker = float64(r.Blocks)/r.P99Seconds/1e6, float64(r.Blocks)/r.MinSeconds/1e6, true
		}
		gb.points = append(gb.points, gbp)
		rate.points = append(rate.points, rp)
		if r.YardstickGBps != nil {
			yp := point{x: float64(r.BlockBytes), y: *r.YardstickGBps}
			if r.YardstickMinGBps != nil && r.YardstickMaxGBps != nil && *r.YardstickMinGBps > 0 {
				yp.lo, yp.hi, yp.hasWhisker = *r.YardstickMinGBps, *r.YardstickMaxGBps, true
			}
			yard.points = append(yard.points, yp)
		}
		if r.PerftestGBps != nil {
			perf.points = append(perf.points, point{x: float64(r.BlockBytes), y: *r.PerftestGBps})
		}
	}
	top := &panel{title: "Throughput", yLabel: "GB/s (1e9 bytes/s, log scale)", top: panelTop1, bot: panelBot1, series: []series{gb}}
	if len(perf.points) > 0 {
		top.series = append(top.series, perf)
	}
	if len(yard.points) > 0 {
		top.series = append(top.series, yard)
	}
	if rep.Yardstick != nil && rep.Yardstick.GBps > 0 {
		top.hline = &hline{y: rep.Yardstick.GBps, name: fmt.Sprintf("TCP loopback yardstick, 1 stream (%.2f GB/s)", rep.Yardstick.GBps), color: colorYard}
	}
	bottom := &panel{title: "Block rate", yLabel: "million blocks/s (log scale)", top: panelTop2, bot: panelBot2, series: []series{rate}}
	for _, p := range []*panel{top, bottom} {
		p.fitY()
	}

	fmt.Fprintf(b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s">`+"\n", svgWidth, svgHeight, svgWidth, svgHeight, fontFamily)
	fmt.Fprintf(b, `<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", svgWidth, svgHeight)
	transport := rep.Transport
	if transport == "" {
		transport = "no transport"
	}
	title := fmt.Sprintf("b2bd: batches of discrete blocks, %s, %s", transport, modeDescription(rep.Mode))
	text(b, svgWidth/2, 28, title, "middle", 18, "bold", colorAxis)
	text(b, svgWidth/2, 48, subtitle(rep, rows), "middle", 12, "normal", colorTextLo)

	for _, p := range []*panel{top, bottom} {
		drawPanel(b, p, x, p == bottom)
	}
	text(b, (plotLeft+plotRight)/2, panelBot2+45, "block size (bytes, log2 scale)", "middle", 13, "normal", colorAxis)
	foot := "Markers: median of the timed batches; whiskers: fastest to slowest batch; hollow markers: fewer blocks than requested (RAM cap)."
	text(b, plotLeft, svgHeight-14, foot, "start", 11, "normal", colorTextLo)
	b.WriteString("</svg>\n")
}

func modeDescription(mode string) string {
	if mode == "two-host" {
		return "two hosts"
	}
	return "two daemons on one host (loopback)"
}

func subtitle(rep *Report, rows []Row) string {
	blocks := 0
	for _, r := range rows {
		blocks = max(blocks, r.BlocksRequested)
	}
	s := fmt.Sprintf("%s blocks per batch at random, non-adjacent slots; median of %d timed batches per size", groupThousands(blocks), rep.Iterations)
	if rep.Host.CPUs > 0 {
		s += fmt.Sprintf("; %d CPUs", rep.Host.CPUs)
	}
	if len(rows) > 0 && rows[0].SMsUsedLabel != "" {
		s += "; SMs used: " + rows[0].SMsUsedLabel
	}
	return s
}

func groupThousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func newXAxis(rows []Row) xAxis {
	if len(rows) == 0 {
		return xAxis{lo: 7 - 0.5, hi: 21 + 0.5} // the default sweep, 128 B to 2 MiB
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		v := math.Log2(float64(r.BlockBytes))
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	// Half an octave of margin keeps end markers off the frame.
	return xAxis{lo: math.Floor(lo) - 0.5, hi: math.Ceil(hi) + 0.5}
}

// fitY picks a decade-aligned log range covering every value, and ticks.
func (p *panel) fitY() {
	lo, hi := math.Inf(1), math.Inf(-1)
	see := func(v float64) {
		if v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	for _, s := range p.series {
		for _, pt := range s.points {
			see(pt.y)
			if pt.hasWhisker {
				see(pt.lo)
				see(pt.hi)
			}
		}
	}
	if p.hline != nil {
		see(p.hline.y)
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0.1, 10
	}
	p.yLo, p.yHi = math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if p.yHi-p.yLo < 1 {
		p.yHi = p.yLo + 1
	}
	decades := p.yHi - p.yLo
	for e := p.yLo; e <= p.yHi; e++ {
		base := math.Pow(10, e)
		p.ticks = append(p.ticks, base)
		for m := 2.0; m <= 9 && e < p.yHi; m++ {
			v := m * base
			if decades <= 3 && (m == 2 || m == 5) {
				p.ticks = append(p.ticks, v)
			} else {
				p.minorTicks = append(p.minorTicks, v)
			}
		}
	}
}

func drawPanel(b *bytes.Buffer, p *panel, x xAxis, xLabels bool) {
	// Frame, gridlines, ticks.
	for _, v := range p.minorTicks {
		y := p.py(v)
		line(b, plotLeft, y, plotRight, y, colorMinor, 1, "")
	}
	for _, v := range p.ticks {
		y := p.py(v)
		line(b, plotLeft, y, plotRight, y, colorGrid, 1, "")
		line(b, plotLeft-5, y, plotLeft, y, colorAxis, 1, "")
		text(b, plotLeft-8, y+4, formatTick(v), "end", 11, "normal", colorAxis)
	}
	for e := math.Ceil(x.lo); e <= x.hi; e++ {
		px := x.px(math.Pow(2, e))
		line(b, px, p.top, px, p.bot, colorGrid, 1, "")
		line(b, px, p.bot, px, p.bot+5, colorAxis, 1, "")
		if xLabels {
			text(b, px, p.bot+19, formatSizeTick(uint64(math.Pow(2, e))), "middle", 11, "normal", colorAxis)
		}
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="%s" stroke-width="1"/>`+"\n",
		plotLeft, p.top, plotRight-plotLeft, p.bot-p.top, colorAxis)
	text(b, plotLeft, p.top-8, p.title, "start", 14, "bold", colorAxis)
	cy := (p.top + p.bot) / 2
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="12" fill="%s" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n",
		28.0, cy, colorAxis, 28.0, cy, esc(p.yLabel))

	// Data, clipped to the panel.
	clip := fmt.Sprintf("clip%.0f", p.top)
	fmt.Fprintf(b, `<clipPath id="%s"><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f"/></clipPath>`+"\n",
		clip, plotLeft, p.top, plotRight-plotLeft, p.bot-p.top)
	fmt.Fprintf(b, `<g clip-path="url(#%s)">`+"\n", clip)
	if p.hline != nil {
		y := p.py(p.hline.y)
		line(b, plotLeft, y, plotRight, y, p.hline.color, 1.5, "6 4")
	}
	for _, s := range p.series {
		drawSeries(b, p, x, s)
	}
	b.WriteString("</g>\n")
	drawLegend(b, p, x)
}

func drawSeries(b *bytes.Buffer, p *panel, x xAxis, s series) {
	var pts []string
	for _, pt := range s.points {
		if pt.y > 0 {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x.px(pt.x), p.py(pt.y)))
		}
	}
	if len(pts) > 1 {
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="5 3"`
		}
		fmt.Fprintf(b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2" stroke-linejoin="round"%s/>`+"\n", strings.Join(pts, " "), s.color, dash)
	}
	for _, pt := range s.points {
		if pt.y <= 0 {
			continue
		}
		px, py := x.px(pt.x), p.py(pt.y)
		if pt.hasWhisker && pt.lo > 0 && pt.hi > 0 {
			y1, y2 := p.py(pt.lo), p.py(pt.hi)
			line(b, px, y1, px, y2, s.color, 1.2, "")
			line(b, px-3, y1, px+3, y1, s.color, 1.2, "")
			line(b, px-3, y2, px+3, y2, s.color, 1.2, "")
		}
		marker(b, s.marker, px, py, s.color, pt.hollow)
	}
}

func marker(b *bytes.Buffer, kind string, x, y float64, color string, hollow bool) {
	fill := color
	if hollow {
		fill = "#ffffff"
	}
	switch kind {
	case "circle":
		fmt.Fprintf(b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s" stroke="%s" stroke-width="1.5"/>`+"\n", x, y, fill, color)
	case "square":
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="7" height="7" fill="%s" stroke="%s" stroke-width="1.5"/>`+"\n", x-3.5, y-3.5, fill, color)
	}
}

// drawLegend puts the legend in whichever inner corner holds the fewest
// data points, so it never hides the curve.
func drawLegend(b *bytes.Buffer, p *panel, x xAxis) {
	type entry struct {
		name, color, marker string
		dashed              bool
	}
	var entries []entry
	for _, s := range p.series {
		if len(s.points) > 0 {
			entries = append(entries, entry{s.name, s.color, s.marker, s.dashed})
		}
	}
	if p.hline != nil {
		entries = append(entries, entry{p.hline.name, p.hline.color, "none", true})
	}
	if len(entries) == 0 {
		return
	}
	longest := 0
	for _, e := range entries {
		longest = max(longest, len(e.name))
	}
	w := 44 + 6.2*float64(longest)
	h := 10 + 18*float64(len(entries))
	const pad = 10.0
	corners := [][2]float64{
		{plotLeft + pad, p.top + pad}, {plotRight - pad - w, p.top + pad},
		{plotLeft + pad, p.bot - pad - h}, {plotRight - pad - w, p.bot - pad - h},
	}
	best, bestHits := corners[0], math.MaxInt
	for _, c := range corners {
		hits := 0
		for _, s := range p.series {
			for _, pt := range s.points {
				if pt.y <= 0 {
					continue
				}
				px, py := x.px(pt.x), p.py(pt.y)
				if px >= c[0]-8 && px <= c[0]+w+8 && py >= c[1]-8 && py <= c[1]+h+8 {
					hits++
				}
			}
		}
		if p.hline != nil {
			if y := p.py(p.hline.y); y >= c[1]-4 && y <= c[1]+h+4 {
				hits += 3 // a line through the legend is worse than a point
			}
		}
		if hits < bestHits {
			best, bestHits = c, hits
		}
	}
	lx, ly := best[0], best[1]
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#ffffff" fill-opacity="0.92" stroke="#bbbbbb" stroke-width="1" rx="3"/>`+"\n", lx, ly, w, h)
	for i, e := range entries {
		cy := ly + 14 + 18*float64(i)
		dash := ""
		if e.dashed {
			dash = "5 3"
		}
		line(b, lx+8, cy, lx+34, cy, e.color, 2, dash)
		marker(b, e.marker, lx+21, cy, e.color, false)
		text(b, lx+40, cy+4, e.name, "start", 11, "normal", colorAxis)
	}
}

func line(b *bytes.Buffer, x1, y1, x2, y2 float64, color string, width float64, dash string) {
	d := ""
	if dash != "" {
		d = fmt.Sprintf(` stroke-dasharray="%s"`, dash)
	}
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>`+"\n", x1, y1, x2, y2, color, width, d)
}

func text(b *bytes.Buffer, x, y float64, s, anchor string, size int, weight, color string) {
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%d" font-weight="%s" fill="%s">%s</text>`+"\n", x, y, anchor, size, weight, color, esc(s))
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// formatTick writes a log-axis tick value without float noise: 0.001, 0.2, 50.
func formatTick(v float64) string {
	rounded, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 3, 64), 64)
	if err != nil {
		rounded = v
	}
	return strconv.FormatFloat(rounded, 'f', -1, 64)
}

// formatSizeTick writes block sizes compactly for the x axis: 128, 1K, 2M.
func formatSizeTick(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.FormatUint(n, 10)
}
