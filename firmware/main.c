/*
 * gpupass guest firmware: enumerate PCI bus 0, size and assign every BAR into
 * the windows the VMM announces (32-bit BARs in the hole below 4 GiB, 64-bit
 * BARs in the window above 4 GiB), read the first and last dword of each
 * memory BAR, read the Bochs "dispi" ID of 1234:1111 display devices,
 * optionally loop reads of one BAR (exit counting), and report everything as
 * `FW ...` lines on the serial port. Long mode (entry.S), identity-mapped,
 * BARs above 4 GiB mapped on demand (map_phys). With QEMU's edu, a DMA test through the
 * IOMMU (dma_test). No interrupts.
 *
 * Output lines (parsed by gpupass, src/vmm/report.rs; documented in docs/vmm.md):
 *   FW hello v3 ram 0x4000000 mmio 0xc0000000-0xfebfffff mmio64 0x100000000-0xffffffffff phys-bits 40
 *   FW dev 00:01.0 1234:1111 class 030000 hdr 00
 *   FW bar 2 mem32 addr 0xc1000000 size 0x1000 first 0xffffff00 last 0x0
 *   FW bar 2 mem64 pref addr 0x400000000 size 0x400000000 first 0x0 last 0x0
 *   FW bar 1 mem64 pref size 0x40000000000 unassigned
 *   FW dispi 00:01.0 0xb0c5
 *   FW loop 00:01.0 bar 2 count 100000 last 0xffffff00
 *   FW dma 00:01.0 bytes 4096 to-device ok polls 9 from-device ok polls 9 match 4096 first-mismatch none seed 0x1
 *   FW iso 00:01.0 iova 0x4000000 bytes 4096 read ok polls 9 copy-back ok polls 9 saw zeros
 *   FW done devices 2
 */
#include "protocol.h"

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned long uptr;

/* The compiler may emit calls to these for struct copies even when freestanding. */
void *memcpy(void *dst, const void *src, unsigned long n);
void *memset(void *dst, int c, unsigned long n);
void *memcpy(void *dst, const void *src, unsigned long n)
{
	u8 *d = dst;
	const u8 *s = src;
	while (n--)
		*d++ = *s++;
	return dst;
}
void *memset(void *dst, int c, unsigned long n)
{
	u8 *d = dst;
	while (n--)
		*d++ = (u8)c;
	return dst;
}

static inline void outb(u16 port, u8 v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outw(u16 port, u16 v) { __asm__ volatile("outw %0, %1" : : "a"(v), "Nd"(port)); }
static inline void outl(u16 port, u32 v) { __asm__ volatile("outl %0, %1" : : "a"(v), "Nd"(port)); }
static inline u16 inw(u16 port)
{
	u16 v;
	__asm__ volatile("inw %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}
static inline u32 inl(u16 port)
{
	u32 v;
	__asm__ volatile("inl %1, %0" : "=a"(v) : "Nd"(port));
	return v;
}
static inline u32 mmio_read32(u64 addr) { return *(volatile u32 *)(uptr)addr; }
static inline void mmio_write32(u64 addr, u32 v) { *(volatile u32 *)(uptr)addr = v; }
static inline u16 mmio_read16(u64 addr) { return *(volatile u16 *)(uptr)addr; }

/* ---- console: the VMM's UART is always ready, so no LSR polling (one exit per byte).
 * (`rep outsb` of a whole line was tried: KVM's emulator still exits once per byte for
 * string OUTs, on kvm_pvm and on nested SVM alike, so it bought nothing.) */

static void putc(char c) { outb(PORT_SERIAL, (u8)c); }

static void puts(const char *s)
{
	while (*s)
		putc(*s++);
}

/* Hex digits of v; at least `width` digits (0 = as few as needed). */
static void puthex(u64 v, int width)
{
	static const char digits[] = "0123456789abcdef";
	char buf[16];
	int n = 0;
	do {
		buf[n++] = digits[(u32)v & 0xf];
		v >>= 4;
	} while (v && n < 16);
	while (n < width && n < 16)
		buf[n++] = '0';
	while (n)
		putc(buf[--n]);
}

static void put0x(u64 v)
{
	puts("0x");
	puthex(v, 0);
}

static void putdec(u32 v)
{
	char buf[10];
	int n = 0;
	do {
		/* Division by a constant compiles to a multiply: no libgcc needed. */
		buf[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		putc(buf[--n]);
}

/* ---- page tables: entry.S identity-maps the low 4 GiB; map_phys adds 2 MiB pages above it */

#define PTE_P_RW  0x3ull
#define PDE_2M_UC 0x9bull /* present, writable, PWT, PCD, 2 MiB page */
#define PTE_ADDR  0x000ffffffffff000ull

static uptr pt_next = FW_PT_POOL;

static u64 *table(uptr pa)
{
	u64 *t;
	/* Launder the address: gcc 12 warns about dereferencing literal pointers. */
	__asm__("" : "=r"(t) : "0"(pa));
	return t;
}

/* The table `entry` points to; a zeroed one from the pool when absent (0: pool empty). */
static u64 *next_table(u64 *entry)
{
	if (!(*entry & 1)) {
		if (pt_next >= FW_PT_END)
			return 0;
		u64 *t = table(pt_next);
		for (int i = 0; i < 512; i++)
			t[i] = 0;
		*entry = (u64)pt_next | PTE_P_RW;
		pt_next += 0x1000;
	}
	return table((uptr)(*entry & PTE_ADDR));
}

/* Identity-map (uncached) the 2 MiB page holding `pa`; 1 when it is reachable. */
static int map_phys(u64 pa)
{
	if (pa < 0x100000000ull)
		return 1;
	if (pa >> 47)
		return 0; /* no canonical identity address */
	u64 *pdpt = next_table(&table(FW_PT_BASE)[(pa >> 39) & 511]);
	if (!pdpt)
		return 0;
	u64 *pd = next_table(&pdpt[(pa >> 30) & 511]);
	if (!pd)
		return 0;
	u64 *pde = &pd[(pa >> 21) & 511];
	if (!(*pde & 1)) {
		*pde = (pa & ~0x1fffffull) | PDE_2M_UC;
		__asm__ volatile("invlpg (%0)" : : "r"((uptr)pa) : "memory");
	}
	return 1;
}

/* ---- PCI configuration mechanism #1 (ports 0xcf8 / 0xcfc) */

static u32 cfg_addr(u32 dev, u32 fn, u32 off)
{
	return 0x80000000u | (dev << 11) | (fn << 8) | (off & 0xfc);
}
static u32 cfg_read32(u32 dev, u32 fn, u32 off)
{
	outl(PORT_PCI_ADDR, cfg_addr(dev, fn, off));
	return inl(PORT_PCI_DATA);
}
static u16 cfg_read16(u32 dev, u32 fn, u32 off)
{
	outl(PORT_PCI_ADDR, cfg_addr(dev, fn, off));
	return inw((u16)(PORT_PCI_DATA + (off & 2)));
}
static void cfg_write32(u32 dev, u32 fn, u32 off, u32 v)
{
	outl(PORT_PCI_ADDR, cfg_addr(dev, fn, off));
	outl(PORT_PCI_DATA, v);
}
static void cfg_write16(u32 dev, u32 fn, u32 off, u16 v)
{
	outl(PORT_PCI_ADDR, cfg_addr(dev, fn, off));
	outw((u16)(PORT_PCI_DATA + (off & 2)), v);
}

static void put_bdf(u32 dev, u32 fn)
{
	puts("00:");
	puthex(dev, 2);
	putc('.');
	puthex(fn, 1);
}

/* ---- BAR sizing and assignment */

enum bar_kind { BAR_NONE, BAR_IO, BAR_MEM32, BAR_MEM64 };

struct bar {
	enum bar_kind kind;
	int pref;
	int assigned;
	u64 size;
	u64 addr;
};

static struct boot_info info;
static u32 next_mem, next_io;
static u64 next_mem64;

static u64 align_up(u64 v, u64 a) { return (v + a - 1) & ~(a - 1); }

/* Size BAR i (decode is off while we do it) and give it an address. Returns the
 * number of registers used (2 for a 64-bit BAR). */
static int size_and_assign(u32 dev, u32 fn, int i, struct bar *b)
{
	u32 off = 0x10 + 4 * (u32)i;
	u32 orig = cfg_read32(dev, fn, off);
	cfg_write32(dev, fn, off, 0xffffffffu);
	u32 lo = cfg_read32(dev, fn, off);
	cfg_write32(dev, fn, off, orig);
	b->kind = BAR_NONE;
	b->assigned = 0;
	b->pref = 0;
	b->size = 0;
	b->addr = 0;
	if (lo == 0 || lo == 0xffffffffu)
		return 1;
	if (orig & 1) {
		b->kind = BAR_IO;
		b->size = (u64)((~(lo & ~3u) + 1) & 0xffffu);
		if (b->size == 0)
			return 1;
		u64 base = align_up(next_io, b->size);
		if (base + b->size - 1 <= info.io_limit) {
			cfg_write32(dev, fn, off, (u32)base);
			b->addr = base;
			b->assigned = 1;
			next_io = (u32)(base + b->size);
		}
		return 1;
	}
	b->pref = (orig >> 3) & 1;
	u32 hi = 0xffffffffu;
	int regs = 1;
	if (((orig >> 1) & 3) == 2 && i < 5) {
		u32 orig_hi = cfg_read32(dev, fn, off + 4);
		cfg_write32(dev, fn, off + 4, 0xffffffffu);
		hi = cfg_read32(dev, fn, off + 4);
		cfg_write32(dev, fn, off + 4, orig_hi);
		b->kind = BAR_MEM64;
		regs = 2;
	} else {
		b->kind = BAR_MEM32;
	}
	u64 mask = ((u64)hi << 32) | (lo & ~0xfu);
	b->size = ~mask + 1;
	if (b->size == 0 || (b->size & (b->size - 1)))
		return regs; /* not a power of two: a broken BAR, leave it alone */
	/* 64-bit BARs go above 4 GiB (the window the VMM announces), else into the hole. */
	if (regs == 2 && info.mmio64_limit > info.mmio64_base) {
		u64 base64 = align_up(next_mem64, b->size);
		if (base64 >= next_mem64 && base64 + b->size - 1 <= info.mmio64_limit) {
			cfg_write32(dev, fn, off, (u32)base64);
			cfg_write32(dev, fn, off + 4, (u32)(base64 >> 32));
			b->addr = base64;
			b->assigned = 1;
			next_mem64 = base64 + b->size;
			return regs;
		}
	}
	u64 base = align_up(next_mem, b->size);
	if (b->size <= 0x100000000ull && base + b->size - 1 <= info.mmio_limit) {
		cfg_write32(dev, fn, off, (u32)base);
		if (regs == 2)
			cfg_write32(dev, fn, off + 4, 0);
		b->addr = base;
		b->assigned = 1;
		next_mem = (u32)(base + b->size);
	}
	return regs;
}

static void print_bar(int i, const struct bar *b)
{
	puts("FW bar ");
	putdec((u32)i);
	puts(b->kind == BAR_IO ? " io" : b->kind == BAR_MEM64 ? " mem64" : " mem32");
	if (b->pref)
		puts(" pref");
	if (b->assigned) {
		puts(" addr ");
		put0x(b->addr);
	}
	puts(" size ");
	put0x(b->size);
	if (!b->assigned) {
		puts(" unassigned\n");
		return;
	}
	puts(" first ");
	if (b->kind == BAR_IO) {
		put0x(inl((u16)b->addr));
		putc('\n');
		return;
	}
	u64 last = b->addr + b->size - 4;
	if (!map_phys(b->addr) || !map_phys(last)) {
		puts("unmapped\n");
		return;
	}
	put0x(mmio_read32(b->addr));
	puts(" last ");
	put0x(mmio_read32(last));
	putc('\n');
}

/* The device the read loop targets: the first function that is not a bridge. */
static struct {
	int found;
	u32 dev, fn;
	u16 vendor, device;
	struct bar bars[6];
} target;

static void probe_function(u32 dev, u32 fn, u32 *count)
{
	u32 id = cfg_read32(dev, fn, 0);
	u16 vendor = (u16)id, device = (u16)(id >> 16);
	u32 class = cfg_read32(dev, fn, 8) >> 8;
	u8 hdr = (u8)(cfg_read32(dev, fn, 0xc) >> 16);
	struct bar bars[6];

	(*count)++;
	puts("FW dev ");
	put_bdf(dev, fn);
	putc(' ');
	puthex(vendor, 4);
	putc(':');
	puthex(device, 4);
	puts(" class ");
	puthex(class, 6);
	puts(" hdr ");
	puthex(hdr, 2);
	putc('\n');

	for (int i = 0; i < 6; i++) {
		bars[i].kind = BAR_NONE;
		bars[i].assigned = 0;
		bars[i].pref = 0;
		bars[i].size = 0;
		bars[i].addr = 0;
	}
	if ((hdr & 0x7f) != 0)
		return; /* bridges: no BARs of interest here */

	u16 cmd = cfg_read16(dev, fn, 4);
	cfg_write16(dev, fn, 4, (u16)(cmd & ~3u)); /* decode off while sizing */
	int have_io = 0, have_mem = 0;
	for (int i = 0; i < 6;) {
		int regs = size_and_assign(dev, fn, i, &bars[i]);
		if (bars[i].assigned) {
			if (bars[i].kind == BAR_IO)
				have_io = 1;
			else
				have_mem = 1;
		}
		i += regs;
	}
	cfg_write16(dev, fn, 4, (u16)(cmd | (have_mem ? 2 : 0) | (have_io ? 1 : 0)));

	for (int i = 0; i < 6; i++)
		if (bars[i].kind != BAR_NONE)
			print_bar(i, &bars[i]);

	if (vendor == 0x1234 && device == 0x1111 && bars[2].assigned && bars[2].kind != BAR_IO) {
		puts("FW dispi ");
		put_bdf(dev, fn);
		puts(" ");
		put0x(mmio_read16(bars[2].addr + 0x500));
		putc('\n');
	}

	if (!target.found && (class >> 16) != 0x06) {
		target.found = 1;
		target.dev = dev;
		target.fn = fn;
		target.vendor = vendor;
		target.device = device;
		for (int i = 0; i < 6; i++)
			target.bars[i] = bars[i];
	}
}

/* ---- DMA through the IOMMU: QEMU's edu (1234:11e8; docs/specs/edu.rst in QEMU). BAR0
 * registers: 0x80 source, 0x88 destination, 0x90 count, 0x98 command (bit 0 start/busy, bit 1
 * direction: 0 RAM -> device, 1 device -> RAM); the device's own 4 KiB buffer is at device
 * address 0x40000. edu masks DMA addresses to 28 bits, so every IOVA used is below 256 MiB. */

#define EDU_VENDOR     0x1234
#define EDU_DEVICE     0x11e8
#define EDU_DMA_SRC    0x80
#define EDU_DMA_DST    0x88
#define EDU_DMA_CNT    0x90
#define EDU_DMA_CMD    0x98
#define EDU_CMD_RUN    1u
#define EDU_CMD_TO_RAM 2u
#define EDU_BUF        0x40000u
#define EDU_DMA_MASK   0xfffffffull
/* Polls of the command register before a transfer counts as stuck (edu finishes a transfer
 * from a 100 ms timer; a poll is one trapped or slot-mapped MMIO read). */
#define EDU_MAX_POLLS  200000000u

static u32 *ram32(uptr pa)
{
	u32 *p;
	__asm__("" : "=r"(p) : "0"(pa));
	return p;
}

/* The test pattern's word i: a multiplicative hash of the seed and the index (no zero runs,
 * no repeats within a page, different per run). */
static u32 pattern(u32 seed, u32 i)
{
	u32 x = seed ^ (i * 0x9e3779b9u);
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	return x;
}

/* One edu transfer of FW_DMA_LEN bytes; returns the polls it took, 0 when it never finished. */
static u32 edu_dma(u64 bar, u32 src, u32 dst, u32 cmd)
{
	mmio_write32(bar + EDU_DMA_SRC, src);
	mmio_write32(bar + EDU_DMA_DST, dst);
	mmio_write32(bar + EDU_DMA_CNT, FW_DMA_LEN);
	mmio_write32(bar + EDU_DMA_CMD, cmd | EDU_CMD_RUN);
	for (u32 n = 1; n <= EDU_MAX_POLLS; n++) {
		if (!(mmio_read32(bar + EDU_DMA_CMD) & EDU_CMD_RUN))
			return n;
		__asm__ volatile("pause");
	}
	return 0;
}

static void put_polls(const char *what, u32 polls)
{
	puts(what);
	if (polls) {
		puts(" ok polls ");
		putdec(polls);
	} else {
		puts(" timeout");
	}
}

/* The read from an IOVA outside guest RAM (see dma_test); `dma_ok`: the mapped copy worked,
 * so the device buffer holds the pattern and copies back to RAM. */
static void iso_test(u32 dev, u32 fn, u64 bar, int dma_ok)
{
	u32 words = FW_DMA_LEN / 4;
	u32 *src = ram32(FW_DMA_SRC), *iso = ram32(FW_DMA_ISO);
	/* The first page past guest RAM: never DMA-mapped (IOVA = GPA covers RAM only). */
	u64 iova = align_up(info.ram_size, 0x1000);
	puts("FW iso ");
	if (iova + FW_DMA_LEN - 1 > EDU_DMA_MASK) {
		puts("none ram-reaches-dma-mask\n");
		return;
	}
	if (!dma_ok) {
		puts("none dma-failed\n");
		return;
	}
	outl(PORT_MARK, MARK_ISO_BEGIN);
	u32 p_rd = edu_dma(bar, (u32)iova, EDU_BUF, 0);
	u32 p_back = p_rd ? edu_dma(bar, EDU_BUF, FW_DMA_ISO, EDU_CMD_TO_RAM) : 0;
	outl(PORT_MARK, MARK_ISO_END);
	__asm__ volatile("mfence" ::: "memory");
	u32 zeros = 0, ones = 0, pat = 0, fill = 0;
	for (u32 i = 0; i < words; i++) {
		u32 v = iso[i];
		zeros += v == 0;
		ones += v == 0xffffffffu;
		pat += v == src[i];
		fill += v == 0xa5a5a5a5u;
	}
	put_bdf(dev, fn);
	puts(" iova ");
	put0x(iova);
	puts(" bytes ");
	putdec(FW_DMA_LEN);
	put_polls(" read", p_rd);
	put_polls(" copy-back", p_back);
	puts(" saw ");
	puts(zeros == words ? "zeros" : ones == words ? "ones" : pat == words ? "unchanged"
	     : fill == words ? "no-copy-back" : "data");
	putc('\n');
}

/* Copy a pattern RAM -> device -> RAM and compare; then read from an IOVA outside guest RAM
 * (which the VMM does not DMA-map) into the device and copy the device buffer back, to see
 * what the device got:
 *   FW dma 00:01.0 bytes 4096 to-device ok polls N from-device ok polls N match 4096 first-mismatch none seed 0x..
 *   FW iso 00:01.0 iova 0x4000000 bytes 4096 read ok polls N copy-back ok polls N saw zeros
 * saw: zeros / ones (the read delivered no data), unchanged (the device buffer kept the
 * pattern), no-copy-back (the destination kept its fill: the copy back failed too), data
 * (something else arrived: not blocked); `FW iso none <why>` when it cannot run. */
static void dma_test(u32 dev, u32 fn, u64 bar)
{
	u32 words = FW_DMA_LEN / 4, seed = info.dma_seed;
	u32 *src = ram32(FW_DMA_SRC), *dst = ram32(FW_DMA_DST), *iso = ram32(FW_DMA_ISO);
	for (u32 i = 0; i < words; i++) {
		src[i] = pattern(seed, i);
		dst[i] = ~pattern(seed, i);
		iso[i] = 0xa5a5a5a5u;
	}
	u16 cmd = cfg_read16(dev, fn, 4);
	cfg_write16(dev, fn, 4, (u16)(cmd | 4)); /* bus master */
	__asm__ volatile("mfence" ::: "memory");

	outl(PORT_MARK, MARK_DMA_BEGIN);
	u32 p_in = edu_dma(bar, FW_DMA_SRC, EDU_BUF, 0);
	u32 p_out = p_in ? edu_dma(bar, EDU_BUF, FW_DMA_DST, EDU_CMD_TO_RAM) : 0;
	outl(PORT_MARK, MARK_DMA_END);
	__asm__ volatile("mfence" ::: "memory");
	u32 same = 0, first = words;
	for (u32 i = 0; i < words; i++) {
		u32 a = src[i], b = dst[i];
		for (u32 k = 0; k < 4; k++, a >>= 8, b >>= 8) {
			if ((u8)a == (u8)b)
				same++;
			else if (first == words)
				first = i * 4 + k;
		}
	}
	puts("FW dma ");
	put_bdf(dev, fn);
	puts(" bytes ");
	putdec(FW_DMA_LEN);
	put_polls(" to-device", p_in);
	put_polls(" from-device", p_out);
	puts(" match ");
	putdec(same);
	puts(" first-mismatch ");
	if (first == words)
		puts("none");
	else
		put0x(first);
	puts(" seed ");
	put0x(seed);
	putc('\n');

	iso_test(dev, fn, bar, p_in && p_out && same == FW_DMA_LEN);
	cfg_write16(dev, fn, 4, cmd);
}

static void read_loop(void)
{
	u32 bar = info.loop_bar;
	if (!target.found) {
		puts("FW loop none no-device\n");
		return;
	}
	if (bar == LOOP_BAR_AUTO) {
		bar = 6;
		if (target.vendor == 0x1234 && target.device == 0x1111 && target.bars[2].assigned)
			bar = 2;
		for (u32 i = 0; i < 6 && bar == 6; i++)
			if (target.bars[i].assigned && target.bars[i].kind != BAR_IO)
				bar = i;
	}
	if (bar > 5 || !target.bars[bar].assigned || target.bars[bar].kind == BAR_IO) {
		puts("FW loop none no-memory-bar\n");
		return;
	}
	u64 addr = target.bars[bar].addr;
	if (!map_phys(addr)) {
		puts("FW loop none unmapped\n");
		return;
	}
	u32 v = 0;
	outl(PORT_MARK, MARK_LOOP_BEGIN);
	for (u32 n = info.loop_count; n; n--)
		v = mmio_read32(addr);
	outl(PORT_MARK, MARK_LOOP_END);
	puts("FW loop ");
	put_bdf(target.dev, target.fn);
	puts(" bar ");
	putdec(bar);
	puts(" count ");
	putdec(info.loop_count);
	puts(" last ");
	put0x(v);
	putc('\n');
}

/* Called from entry.S in long mode; returns the exit status. */
u32 fw_main(void)
{
	/* Launder the constant address: gcc 12 warns about dereferencing literal pointers. */
	const volatile struct boot_info *bi;
	__asm__("" : "=r"(bi) : "0"(FW_BOOT_INFO));
	info = *bi;
	if (info.magic != FW_BOOT_MAGIC) {
		puts("FW error no-boot-info\n");
		return 3;
	}
	if (info.version < 2) {
		info.mmio64_base = 0; /* a v1 block: no 64-bit window */
		info.mmio64_limit = 0;
		info.phys_bits = 32;
	}
	if (info.version < 3)
		info.dma_seed = 0x47504431; /* a v2 block: a fixed pattern */
	next_mem = info.mmio_base;
	next_mem64 = info.mmio64_base;
	next_io = info.io_base;
	puts("FW hello v3 ram ");
	put0x(info.ram_size);
	puts(" mmio ");
	put0x(info.mmio_base);
	putc('-');
	put0x(info.mmio_limit);
	puts(" mmio64 ");
	put0x(info.mmio64_base);
	putc('-');
	put0x(info.mmio64_limit);
	puts(" phys-bits ");
	putdec(info.phys_bits);
	putc('\n');

	u32 count = 0;
	for (u32 dev = 0; dev < 32; dev++) {
		if ((u16)cfg_read32(dev, 0, 0) == 0xffff)
			continue;
		u8 hdr = (u8)(cfg_read32(dev, 0, 0xc) >> 16);
		u32 fns = (hdr & 0x80) ? 8 : 1;
		for (u32 fn = 0; fn < fns; fn++) {
			if ((u16)cfg_read32(dev, fn, 0) == 0xffff)
				continue;
			probe_function(dev, fn, &count);
		}
	}
	if (target.found && target.vendor == EDU_VENDOR && target.device == EDU_DEVICE) {
		if (target.bars[0].assigned && target.bars[0].kind != BAR_IO && map_phys(target.bars[0].addr))
			dma_test(target.dev, target.fn, target.bars[0].addr);
		else
			puts("FW dma none no-bar0\n");
	}
	if (info.loop_count)
		read_loop();
	puts("FW done devices ");
	putdec(count);
	putc('\n');
	return 0;
}
