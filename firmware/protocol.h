/*
 * The I/O-port and memory protocol between the gpupass VMM and this firmware.
 * Mirrored in src/vmm/memory.rs (`BootInfo`, layout constants) and src/vmm/vcpu.rs (ports);
 * docs/vmm.md is the reference.
 */
#ifndef GPUPASS_FW_PROTOCOL_H
#define GPUPASS_FW_PROTOCOL_H

#define FW_LOAD          0x1000u   /* flat binary load and entry address (CS:IP 0:0x1000) */
#define FW_BOOT_INFO     0x0500u   /* struct boot_info, written by the VMM */
#define FW_BOOT_MAGIC    0x49425047u /* "GPBI" */
#define FW_BOOT_VERSION  3u
#define FW_STACK_TOP     0x90000u  /* grows down towards the end of the image area (0x80000) */
/* Page tables (long mode, identity map): PML4 at FW_PT_BASE, one PDPT, four PDs mapping the
 * low 4 GiB with 2 MiB pages; the pages after them up to FW_PT_END are a pool for the tables
 * that map BARs above 4 GiB on demand. All of it lies below 1 MiB, the smallest --memory. */
#define FW_PT_BASE       0x90000u
#define FW_PT_POOL       0x96000u
#define FW_PT_END        0x100000u
/* DMA test buffers (edu): between the image area's end and the stack, in every --memory.
 * The VMM DMA-maps all guest RAM at IOVA = GPA, so these are also their IOVAs. */
#define FW_DMA_SRC       0x80000u  /* pattern the device reads (RAM -> device) */
#define FW_DMA_DST       0x81000u  /* where the device writes it back (device -> RAM) */
#define FW_DMA_ISO       0x82000u  /* the device buffer after a read from an unmapped IOVA */
#define FW_DMA_LEN       0x1000u

#define PORT_SERIAL      0x3f8     /* 16550 THR: one byte of console output */
#define PORT_EXIT        0x501     /* out8: end the VM with this status */
#define PORT_MARK        0x502     /* out32: phase marker (1 = read loop begins, 2 = ends) */
#define PORT_PCI_ADDR    0xcf8     /* PCI configuration mechanism #1 */
#define PORT_PCI_DATA    0xcfc

#define MARK_LOOP_BEGIN  1
#define MARK_LOOP_END    2
#define MARK_DMA_BEGIN   3         /* the RAM -> device -> RAM copy */
#define MARK_DMA_END     4
#define MARK_ISO_BEGIN   5         /* the read from an unmapped IOVA and its copy back */
#define MARK_ISO_END     6

#define LOOP_BAR_AUTO    0xffu

#ifndef __ASSEMBLER__
struct boot_info {
	unsigned int magic;      /* FW_BOOT_MAGIC */
	unsigned int version;    /* FW_BOOT_VERSION */
	unsigned int ram_size;   /* bytes of guest RAM at GPA 0 */
	unsigned int mmio_base;  /* 32-bit MMIO hole for BARs: [mmio_base, mmio_limit] */
	unsigned int mmio_limit;
	unsigned int io_base;    /* I/O port window for I/O BARs: [io_base, io_limit] */
	unsigned int io_limit;
	unsigned int loop_count; /* read loop: number of reads (0 = no loop) */
	unsigned int loop_bar;   /* BAR to read in the loop, LOOP_BAR_AUTO = pick */
	unsigned int phys_bits;  /* guest physical address width the vCPU's CPUID reports */
	unsigned long long mmio64_base;  /* 64-bit MMIO window above 4 GiB (offset 40) */
	unsigned long long mmio64_limit; /* inclusive; below 2^phys_bits and 2^47 */
	unsigned int dma_seed;   /* v3: seeds the DMA test pattern (differs per run) (offset 56) */
	unsigned int reserved;
};
#endif

#endif
