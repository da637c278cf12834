/*
 * gpupass guest firmware: entry.
 *
 * The VMM loads the flat binary at FW_LOAD (0x1000) and starts the vCPU in
 * 16-bit real mode with CS = 0, IP = 0x1000 (a reset-like state). We load our
 * own GDT, set CR0.PE and jump to 32-bit protected mode, build identity-mapping
 * page tables for the low 4 GiB (2 MiB pages; the 3-4 GiB MMIO hole uncached),
 * enable PAE, EFER.LME and paging, and far-jump to 64-bit code: the C code runs
 * in long mode and maps BARs above 4 GiB on demand (main.c, map_phys). Every
 * mode switch is done by the guest itself, as a real firmware does.
 */
#include "protocol.h"

#define CR0_PE    0x1
#define CR0_PG    0x80000000
#define CR4_PAE   0x20
#define MSR_EFER  0xc0000080
#define EFER_LME  0x100
#define PTE_P_RW  0x3          /* present, writable */
#define PDE_2M    0x83         /* present, writable, 2 MiB page */
#define PDE_UC    0x18         /* PWT | PCD: uncached (MMIO) */

	.section .text.entry, "ax"
	.code16
	.globl _start
_start:
	cli
	cld
	xorw %ax, %ax
	movw %ax, %ds
	lgdtl gdt_desc
	movl %cr0, %eax
	orl $CR0_PE, %eax
	movl %eax, %cr0
	ljmpl $0x08, $pm32

	.code32
pm32:
	movw $0x10, %ax
	movw %ax, %ds
	movw %ax, %es
	movw %ax, %fs
	movw %ax, %gs
	movw %ax, %ss
	movl $FW_STACK_TOP, %esp
	/* Zero the fixed tables: PML4, PDPT, PD0-PD3 (6 pages). */
	movl $FW_PT_BASE, %edi
	movl $(6 * 4096 / 4), %ecx
	xorl %eax, %eax
	rep stosl
	/* PML4[0] -> PDPT; PDPT[0..3] -> PD0..PD3. */
	movl $(FW_PT_BASE + 0x1000 + PTE_P_RW), FW_PT_BASE
	movl $(FW_PT_BASE + 0x2000 + PTE_P_RW), %eax
	movl $(FW_PT_BASE + 0x1000), %edi
	movl $4, %ecx
1:	movl %eax, (%edi)
	addl $0x1000, %eax
	addl $8, %edi
	loop 1b
	/* 2048 PDEs of 2 MiB from physical 0 (high dwords stay 0); from 3 GiB (index 1536)
	 * uncached. */
	movl $(FW_PT_BASE + 0x2000), %edi
	movl $PDE_2M, %eax
	xorl %ecx, %ecx
2:	movl %eax, %edx
	cmpl $1536, %ecx
	jb 3f
	orl $PDE_UC, %edx
3:	movl %edx, (%edi, %ecx, 8)
	addl $0x200000, %eax
	incl %ecx
	cmpl $2048, %ecx
	jb 2b
	/* PAE, then EFER.LME, CR3, then paging: IA-32e compatibility mode. */
	movl %cr4, %eax
	orl $CR4_PAE, %eax
	movl %eax, %cr4
	movl $FW_PT_BASE, %eax
	movl %eax, %cr3
	movl $MSR_EFER, %ecx
	rdmsr
	orl $EFER_LME, %eax
	wrmsr
	movl %cr0, %eax
	orl $CR0_PG, %eax
	movl %eax, %cr0
	ljmpl $0x18, $lm64

	.code64
lm64:
	movl $FW_STACK_TOP, %esp
	/* Zero .bss (a flat binary does not carry it). */
	movl $__bss_start, %edi
	movl $__bss_end, %ecx
	subl %edi, %ecx
	xorl %eax, %eax
	rep stosb
	call fw_main
	/* fw_main returns the exit status in %al: report it on the exit port. */
	movw $0x501, %dx
	outb %al, %dx
4:	hlt
	jmp 4b

	/* Kept in .text.entry: real mode reaches it with DS = 0 (below 64 KiB). */
	.align 8
gdt:
	.quad 0                        /* null */
	.quad 0x00cf9a000000ffff       /* 0x08: code, base 0, limit 4 GiB, 32-bit */
	.quad 0x00cf92000000ffff       /* 0x10: data, base 0, limit 4 GiB */
	.quad 0x00af9a000000ffff       /* 0x18: code, 64-bit (L) */
gdt_end:
gdt_desc:
	.word gdt_end - gdt - 1
	.long gdt
