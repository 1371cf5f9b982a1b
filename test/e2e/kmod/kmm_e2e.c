// SPDX-License-Identifier: GPL-2.0
/*
 * The out-of-tree module of the e2e-kernel test (docs/e2e.md), built by the test for the guest's
 * kernel from this file with the Debian headers of that kernel. The build sets:
 *   KMM_NAME     the module's name (a string: also the misc device's, /dev/<name>)
 *   KMM_VERSION  its MODULE_VERSION, visible in /sys/module/<name>/version
 *   KMM_FIRMWARE when defined, a firmware file the module requests at init: without it the init
 *                fails (-ENOENT), with it the module logs the firmware's size and first line
 *                and shows the first line in /sys/module/<name>/parameters/firmware.
 * The misc device holds a reference on the module while it is open (fops.owner), so a process
 * holding /dev/<name> open makes `modprobe -r` fail with "in use" (EBUSY).
 */
#include <linux/firmware.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/string.h>

static char firmware[64] = "none";
module_param_string(firmware, firmware, sizeof(firmware), 0444);
MODULE_PARM_DESC(firmware, "the first line of the firmware file the module loaded");

static int kmm_open(struct inode *inode, struct file *file) { return 0; }

static const struct file_operations kmm_fops = {
	.owner = THIS_MODULE,
	.open = kmm_open,
};

static struct miscdevice kmm_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = KMM_NAME,
	.fops = &kmm_fops,
};

#ifdef KMM_FIRMWARE
static int kmm_load_firmware(void)
{
	const struct firmware *fw;
	size_t n;
	int err = request_firmware(&fw, KMM_FIRMWARE, kmm_dev.this_device);

	if (err) {
		pr_err("%s: firmware %s not found: %d\n", KMM_NAME, KMM_FIRMWARE, err);
		return err;
	}
	n = min(fw->size, sizeof(firmware) - 1);
	memcpy(firmware, fw->data, n);
	firmware[n] = '\0';
	firmware[strcspn(firmware, "\n")] = '\0';
	pr_info("%s: firmware %s loaded, %zu bytes: %s\n", KMM_NAME, KMM_FIRMWARE, fw->size, firmware);
	release_firmware(fw);
	return 0;
}
#else
static int kmm_load_firmware(void) { return 0; }
#endif

static int __init kmm_init(void)
{
	int err = misc_register(&kmm_dev);

	if (err)
		return err;
	err = kmm_load_firmware();
	if (err) {
		misc_deregister(&kmm_dev);
		return err;
	}
	pr_info("%s: version %s loaded\n", KMM_NAME, KMM_VERSION);
	return 0;
}

static void __exit kmm_exit(void)
{
	misc_deregister(&kmm_dev);
	pr_info("%s: version %s unloaded\n", KMM_NAME, KMM_VERSION);
}

module_init(kmm_init);
module_exit(kmm_exit);
MODULE_LICENSE("GPL");
MODULE_VERSION(KMM_VERSION);
MODULE_DESCRIPTION("kmm e2e-kernel test module");
